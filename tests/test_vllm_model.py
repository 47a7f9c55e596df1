"""The vLLM SwiftKV model against the HF SwiftKV model, on tiny random checkpoints with SmolLM2's
real tokenizer: greedy token ids equal (fp32 on both sides), for batch mixes with chunked prefill,
mixed prefill/decode steps and prefix caching, for G = 1 and G = 2 (Llama, Qwen2, Qwen3, and a
converted Mistral); prompt tokens really skip the
later layers; AcrossKV really shrinks vLLM's KV cache."""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1200)]  # the first test of each engine starts it

LAYERS, N = 6, 2
CHUNK = 128  # max_num_batched_tokens: longer prompts are prefilled in several chunks
KV_BYTES = 64 * 2**20  # same KV memory for every engine here
NEW_TOKENS = 12


def tiny_checkpoint(path, arch: str, group_size: int, kv_heads: int = 2):
    """A random SwiftKV checkpoint (untrimmed, Snowflake layout) with peaked logits, saved with
    SmolLM2's tokenizer. Peaked logits keep greedy margins far above fp32 noise. `arch` is a family
    (llama, qwen2, qwen3) or "mistral": a Mistral model converted by `build_swiftkv_model` into a
    llama_swiftkv folder. Qwen3 and Mistral get head_dim 32 != hidden / heads and norm weights away
    from 1, so a wrong head size or a missing norm cannot pass."""
    from swiftkv.model.families import FAMILIES
    from swiftkv.model.surgery import build_swiftkv_model
    from swiftkv.sources import load_tokenizer

    tokenizer = load_tokenizer("smollm2-135m-instruct")
    torch.manual_seed(group_size)
    shape = dict(
        vocab_size=len(tokenizer),
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=kv_heads,
        max_position_embeddings=2048,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    newer = arch in ("qwen3", "mistral")
    if newer:
        shape["head_dim"] = 32
    if arch == "mistral":
        from transformers import MistralConfig, MistralForCausalLM

        model = build_swiftkv_model(
            MistralForCausalLM(MistralConfig(**shape, sliding_window=None)), N, group_size
        )
    else:
        family = FAMILIES[arch]
        model = family.model_class(
            family.config_class(
                **shape, swiftkv=True, num_key_value_layers=N, key_value_group_size=group_size
            )
        )
    model.eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() == 2:
                param.normal_(0.0, 0.5 if "embed" in name else 0.15)
            elif name.endswith("bias"):  # Qwen2's q/k/v biases: non-zero, so loading them is tested
                param.normal_(0.0, 0.1)
            elif newer and "norm" in name:  # every RMSNorm, Qwen3's q/k and SwiftKV norms included
                param.uniform_(0.5, 1.5)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return model, tokenizer


# (architecture, G, compiled): the Llama G=1 engine runs the compiled early/late parts as served;
# the Qwen2 G=2 engine (AcrossKV, q/k/v biases) runs eager to keep CI time down. Qwen3 runs G=1 eager
# and G=2 compiled (its grouped k_norm_swiftkv inside the compiled early part); Mistral is a converted
# Mistral model served by the Llama path, with its own head_dim.
ENGINES = [
    ("llama", 1, True),
    ("qwen2", 2, False),
    ("qwen3", 1, False),
    ("qwen3", 2, True),
    ("mistral", 1, False),
]


@pytest.fixture(scope="module", params=ENGINES, ids=[f"{a}-G{g}" for a, g, _ in ENGINES])
def served(request, tmp_path_factory):
    """(vLLM engine, HF model, tokenizer, G) for one tiny checkpoint."""
    from vllm import LLM

    from swiftkv.vllm.engine import engine_kwargs, in_process_engine

    arch, group_size, compiled = request.param
    path = tmp_path_factory.mktemp(f"tiny_{arch}_g{group_size}")
    model, tokenizer = tiny_checkpoint(path, arch, group_size)
    with in_process_engine():
        # kv_sharing_fast_prefill is NOT passed: the plugin's config hook must switch it on.
        llm = LLM(
            **engine_kwargs(str(path), dtype="float32", kv_sharing_fast_prefill=False),
            max_model_len=1024,
            kv_cache_memory_bytes=KV_BYTES,
            max_num_batched_tokens=CHUNK,
            max_num_seqs=8,
            enable_prefix_caching=True,
            enforce_eager=not compiled,
        )
        yield llm, model, tokenizer, group_size
        del llm


def hf_greedy(model, tokenizer, prompt: str, new_tokens: int) -> tuple[list[int], list[float]]:
    """Greedy continuation and the log-probability of each chosen token, from the HF SwiftKV model."""
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(
            ids,
            max_new_tokens=new_tokens,
            do_sample=False,
            output_scores=True,
            return_dict_in_generate=True,
            pad_token_id=tokenizer.eos_token_id,
        )
    tokens = out.sequences[0, ids.shape[1] :].tolist()
    logprobs = [
        torch.log_softmax(s[0].float(), -1)[t].item() for s, t in zip(out.scores, tokens, strict=True)
    ]
    return tokens, logprobs


def vllm_greedy(llm, prompts: list[str], new_tokens: int):
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=new_tokens, temperature=0.0, logprobs=0, ignore_eos=True)
    return llm.generate(prompts, params, use_tqdm=False)


def assert_same_as_hf(outputs, prompts, model, tokenizer, new_tokens=NEW_TOKENS) -> float:
    """Token ids equal; returns the max |logprob difference| of the chosen tokens."""
    worst = 0.0
    for prompt, output in zip(prompts, outputs, strict=True):
        tokens, logprobs = hf_greedy(model, tokenizer, prompt, new_tokens)
        got = list(output.outputs[0].token_ids)
        assert got == tokens, f"prompt {prompt[:40]!r}...: vLLM {got} != HF {tokens}"
        got_logprobs = [step[t].logprob for step, t in zip(output.outputs[0].logprobs, got, strict=True)]
        worst = max(worst, max(abs(a - b) for a, b in zip(got_logprobs, logprobs, strict=True)))
    return worst


def words(n: int, seed: int) -> str:
    vocabulary = "alpha beta gamma delta river stone cloud seven orange window music paper garden".split()
    generator = torch.Generator().manual_seed(seed)
    return " ".join(vocabulary[i] for i in torch.randint(len(vocabulary), (n,), generator=generator).tolist())


def test_plugin_switched_on_fast_prefill(served):
    llm, *_ = served
    assert llm.llm_engine.vllm_config.cache_config.kv_sharing_fast_prefill is True


def test_greedy_equals_hf_batch_with_chunked_prefill(served):
    """Short and long prompts in one batch: the long ones are prefilled in chunks of CHUNK tokens
    while the short ones already decode, so steps mix prefill and decode rows."""
    llm, model, tokenizer, _ = served
    prompts = ["The capital of France is", words(300, 1), "Once upon a time", words(150, 2), words(40, 3)]
    assert max(len(tokenizer(p).input_ids) for p in prompts) > 2 * CHUNK
    worst = assert_same_as_hf(vllm_greedy(llm, prompts, NEW_TOKENS), prompts, model, tokenizer)
    print(f"max |logprob diff| vs HF: {worst:.2e}")
    assert worst < 1e-3


def test_greedy_equals_hf_single_prompts(served):
    llm, model, tokenizer, _ = served
    for prompt in ["Hello", words(200, 4)]:
        assert_same_as_hf(vllm_greedy(llm, [prompt], NEW_TOKENS), [prompt], model, tokenizer)


def test_repeated_prefix_with_prefix_caching(served):
    """The second batch reuses the cached blocks of the shared prefix (early layers' and holders'
    caches) and must still equal HF."""
    llm, model, tokenizer, _ = served
    prefix = words(260, 5)
    first = [prefix + " question one"]
    second = [prefix + " question two", prefix + " another ending here"]
    assert_same_as_hf(vllm_greedy(llm, first, NEW_TOKENS), first, model, tokenizer)
    outputs = vllm_greedy(llm, second, NEW_TOKENS)
    assert min(o.num_cached_tokens for o in outputs) >= 256  # whole blocks of the prefix came from the cache
    assert_same_as_hf(outputs, second, model, tokenizer)


def test_prompt_tokens_skip_later_layers(served):
    """A 300-token prompt with max_tokens=1: the early part sees every token, the later layers see
    one row per step (the last token of each prefill chunk)."""
    llm, *_ = served
    seen = {"early": 0, "late": 0}

    def install(model):
        # The compiled parts bypass module hooks, so count at the eager glue: the rows the model
        # receives (early part) and the rows it hands to the late part.
        swiftkv = model.model
        swiftkv.register_forward_pre_hook(
            lambda _m, args: seen.__setitem__("early", seen["early"] + len(args[1]))
        )
        choose_rows = swiftkv.logits_rows

        def counting_rows():
            rows, num_rows = choose_rows()
            seen["late"] += num_rows if num_rows is not None else 0
            return rows, num_rows

        swiftkv.logits_rows = counting_rows

    def uninstall(model):
        model.model._forward_pre_hooks.clear()
        del model.model.logits_rows

    llm.apply_model(install)
    try:
        from vllm import SamplingParams

        prompt = words(300, 6)
        num_tokens = len(llm.get_tokenizer()(prompt).input_ids)
        llm.generate([prompt], SamplingParams(max_tokens=1, temperature=0.0), use_tqdm=False)
    finally:
        llm.apply_model(uninstall)
    chunks = -(-num_tokens // CHUNK)
    assert seen == {"early": num_tokens, "late": chunks}


def test_kv_capacity_matches_holder_count(served):
    """vLLM allocates caches for the N early layers and one holder per AcrossKV group only:
    capacity = KV bytes / (bytes per token of N + (L - N) / G caches)."""
    from swiftkv.model.config import head_dim_of
    from swiftkv.vllm.engine import kv_cache_tokens

    llm, model, _, group_size = served
    caches = N + (LAYERS - N) // group_size
    bytes_per_token = caches * 2 * 2 * head_dim_of(model.config) * 4  # K and V, 2 KV heads, fp32
    block = llm.llm_engine.vllm_config.cache_config.block_size
    expected = KV_BYTES // bytes_per_token // block * block
    assert kv_cache_tokens(llm) == expected
