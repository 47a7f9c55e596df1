"""Speculative decoding with SwiftKV on the real vLLM CPU engine: the greedy tokens of an ngram (or
suffix) speculating engine equal the HF SwiftKV model's greedy tokens, which the plain engine is held
to in test_vllm_model.py, so speculation changes no output. Llama G = 1 (compiled, as served) and
Qwen2 G = 2 (AcrossKV), with chunked prefill and steps that mix a new prompt's prefill chunk with
other requests' verify rows; vLLM's own counters must show accepted drafts, or the test would prove
nothing. The prompt rows still skip the later layers while verify rows run them.

The tiny models have a vocabulary of 8 tokens: a random model over a large vocabulary never repeats
itself, so no ngram draft would ever be accepted; over 8 tokens its greedy text repeats n-grams by
chance often enough (about one draft token in five is accepted), and its top-2 logit margins (> 0.01)
stay far above fp32 noise. Prompts are token ids (no tokenizer)."""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1500)]

LAYERS, N, VOCAB = 6, 2, 8
CHUNK = 64  # max_num_batched_tokens: the long prompts are prefilled in several chunks
NEW_TOKENS = 40
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
SUFFIX = {"method": "suffix", "num_speculative_tokens": 3}


def small_vocab_checkpoint(path, arch: str, group_size: int, kv_heads: int = 2):
    """A random SwiftKV Llama or Qwen2 (untrimmed, Snowflake layout) over VOCAB tokens, weights drawn as
    in test_vllm_model.tiny_checkpoint (peaked logits). Saved without a tokenizer."""
    from swiftkv import (
        LlamaSwiftKVConfig,
        LlamaSwiftKVForCausalLM,
        Qwen2SwiftKVConfig,
        Qwen2SwiftKVForCausalLM,
    )

    config_class, model_class = {
        "llama": (LlamaSwiftKVConfig, LlamaSwiftKVForCausalLM),
        "qwen2": (Qwen2SwiftKVConfig, Qwen2SwiftKVForCausalLM),
    }[arch]
    torch.manual_seed(group_size)
    config = config_class(
        vocab_size=VOCAB,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=kv_heads,
        max_position_embeddings=2048,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=True,
        swiftkv=True,
        num_key_value_layers=N,
        key_value_group_size=group_size,
        bos_token_id=1,
        eos_token_id=0,
    )
    model = model_class(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() == 2:
                param.normal_(0.0, 0.5 if "embed" in name else 0.15)
            elif name.endswith("bias"):
                param.normal_(0.0, 0.1)
    model.save_pretrained(path)
    return model


def speculating_engine(path, speculative_config: dict, compiled: bool = False, **kwargs):
    from vllm import LLM

    from swiftkv.vllm.engine import engine_kwargs

    return LLM(
        **engine_kwargs(str(path), dtype="float32"),
        speculative_config=speculative_config,
        skip_tokenizer_init=True,
        max_model_len=1024,
        kv_cache_memory_bytes=64 * 2**20,
        max_num_batched_tokens=CHUNK,
        enforce_eager=not compiled,
        disable_log_stats=False,
        **kwargs,
    )


def prompts_with_repeats(count: int, seed: int) -> list[list[int]]:
    """Token-id prompts whose second half repeats the first (n-grams recur), 40 to 240 tokens long:
    the long ones are prefilled in several CHUNK-token chunks."""
    generator = torch.Generator().manual_seed(seed)
    prompts = []
    for i in range(count):
        half = torch.randint(3, VOCAB, (20 + 100 * (i % 3 == 1),), generator=generator).tolist()
        prompts.append(half + half)
    return prompts


def hf_greedy(model, prompt: list[int], new_tokens: int = NEW_TOKENS) -> list[int]:
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]),
            max_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=0,
            eos_token_id=None,
        )
    return out[0, len(prompt) :].tolist()


def vllm_greedy(llm, prompts: list[list[int]], new_tokens: int = NEW_TOKENS) -> list[list[int]]:
    from vllm import SamplingParams, TokensPrompt

    params = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True, detokenize=False)
    outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs]


def spec_counters(llm) -> dict[str, int]:
    """vLLM's own speculative-decoding counters (summed over engines/labels)."""
    totals = {"drafts": 0, "draft_tokens": 0, "accepted_tokens": 0}
    for metric in llm.get_metrics():
        for key in totals:
            if metric.name == f"vllm:spec_decode_num_{key}":
                totals[key] += int(metric.value)
    return totals


def assert_greedy_equals_hf(llm, model, prompts) -> dict[str, int]:
    """Token ids equal HF's for every prompt; returns the spec counters' increase over the run."""
    before = spec_counters(llm)
    got = vllm_greedy(llm, prompts)
    after = spec_counters(llm)
    for prompt, tokens in zip(prompts, got, strict=True):
        expected = hf_greedy(model, prompt)
        assert tokens == expected, f"prompt of {len(prompt)} tokens: vLLM {tokens} != HF {expected}"
    return {key: after[key] - before[key] for key in after}


def install_step_recorder(model) -> None:
    """Record, per forward step: tokens in the step, requests in it, and rows the late part ran on (the
    logits rows: a prefill chunk's last token, every verify row). Counted at the eager glue, as in
    test_vllm_model.test_prompt_tokens_skip_later_layers (the compiled parts bypass module hooks).
    Runs inside the engine's worker through `LLM.apply_model`; `read_step_recorder` returns the steps."""
    from vllm.forward_context import get_forward_context

    swiftkv = model.model
    early_attn = swiftkv.early.layers[0].self_attn.attn.layer_name
    choose_rows = swiftkv.logits_rows
    steps = swiftkv.recorded_steps = []

    def recording_rows():
        rows, num_rows = choose_rows()
        metadata = get_forward_context().attn_metadata
        if isinstance(metadata, dict) and early_attn in metadata:
            early = metadata[early_attn]
            tokens = int(early.num_actual_tokens)
            steps.append(
                {
                    "tokens": tokens,
                    "requests": int(early.query_start_loc.numel()) - 1,
                    "late_rows": tokens if num_rows is None else int(num_rows),
                }
            )
        return rows, num_rows

    swiftkv.logits_rows = recording_rows


def read_step_recorder(model) -> list[dict[str, int]]:
    swiftkv = model.model
    del swiftkv.logits_rows
    return swiftkv.__dict__.pop("recorded_steps")


ENGINES = [("llama", 1, NGRAM, True), ("qwen2", 2, NGRAM, False), ("llama", 2, SUFFIX, False)]


@pytest.fixture(scope="module", params=ENGINES, ids=[f"{a}-G{g}-{s['method']}" for a, g, s, _ in ENGINES])
def speculating(request, tmp_path_factory):
    """(vLLM engine with speculation, HF model, method) for one tiny checkpoint. The engine core runs in
    its own process, as served: vLLM 0.32 cannot start a second engine inside a process where a first
    one ran ngram (its worker init scans every loaded module, and llvmlite, which ngram's numba loads,
    breaks that scan). Functions reach the worker through apply_model, pickled."""
    from swiftkv.vllm.env import configure_cpu_env
    from swiftkv.vllm.speculative import suffix_available

    arch, group_size, speculative_config, compiled = request.param
    if speculative_config["method"] == "suffix" and not suffix_available():
        pytest.skip("suffix decoding needs arctic-inference, not installed here (docs/serving.md)")
    path = tmp_path_factory.mktemp(f"spec_{arch}_g{group_size}")
    model = small_vocab_checkpoint(path, arch, group_size)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # apply_model's functions are pickled
        configure_cpu_env()
        # max_num_seqs=3 < prompts: later prompts are admitted while earlier ones decode and verify.
        llm = speculating_engine(path, speculative_config, compiled=compiled, max_num_seqs=3)
        try:
            yield llm, model, speculative_config["method"]
        finally:
            llm.llm_engine.engine_core.shutdown()
            del llm


def test_engine_speculates_with_fast_prefill(speculating):
    llm, _, method = speculating
    config = llm.llm_engine.vllm_config
    assert config.speculative_config.method == method and config.cache_config.kv_sharing_fast_prefill


def test_greedy_equals_hf_with_mixed_prefill_and_verify_steps(speculating):
    """Six prompts, three at a time, long ones chunked: the tokens equal HF's, drafts were accepted,
    at least one step held a prefill chunk and verify rows together, and the late part ran on exactly
    the logits rows of each step (prompt rows skipped it)."""
    llm, model, _ = speculating
    prompts = prompts_with_repeats(6, seed=1)
    assert max(map(len, prompts)) > 3 * CHUNK
    llm.apply_model(install_step_recorder)
    try:
        counts = assert_greedy_equals_hf(llm, model, prompts)
    finally:
        (steps,) = llm.apply_model(read_step_recorder)
    print(f"speculation: {counts}")
    assert counts["draft_tokens"] > 0 and counts["accepted_tokens"] > 0, counts
    # A verify row is a logits row beyond one per request; a prompt row has none.
    mixed = [s for s in steps if s["late_rows"] > s["requests"] and s["tokens"] > s["late_rows"]]
    assert mixed, f"no step mixed a prefill chunk with verify rows: {steps}"
    # Every decode/verify row needs logits; of a prefill chunk only the last row does. So the rows that
    # skipped the late part are the prompt tokens minus one per prefill chunk, and there are at least
    # as many chunks as prompts and at most one per request and step.
    prompt_tokens = sum(map(len, prompts))
    skipped = sum(s["tokens"] - s["late_rows"] for s in steps)
    assert prompt_tokens - sum(s["requests"] for s in steps) <= skipped <= prompt_tokens - len(prompts)


def test_single_long_prompt_with_repeats(speculating):
    llm, model, _ = speculating
    prompt = prompts_with_repeats(2, seed=2)[1]
    assert len(prompt) > 3 * CHUNK
    counts = assert_greedy_equals_hf(llm, model, [prompt])
    assert counts["draft_tokens"] > 0


@pytest.mark.slow
def test_tp2_ngram_greedy_equals_hf(tmp_path):
    """tensor_parallel_size=2 (one worker process and core per rank, as test_vllm_tp.py): Llama G = 2
    with its 2 KV heads split over the ranks, ngram speculation, chunked prefill."""
    import os

    from swiftkv.vllm.env import configure_cpu_env

    model = small_vocab_checkpoint(tmp_path, "llama", 2)
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
        configure_cpu_env(ranks=2)
        assert "|" in os.environ["VLLM_CPU_OMP_THREADS_BIND"]
        llm = speculating_engine(
            tmp_path, NGRAM, tensor_parallel_size=2, distributed_executor_backend="mp", max_num_seqs=3
        )
        try:
            assert llm.llm_engine.vllm_config.parallel_config.tensor_parallel_size == 2
            counts = assert_greedy_equals_hf(llm, model, prompts_with_repeats(6, seed=3))
        finally:
            llm.llm_engine.engine_core.shutdown()
    print(f"speculation at tp=2: {counts}")
    assert counts["accepted_tokens"] > 0, counts
