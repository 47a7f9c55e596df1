"""Tensor parallelism on vLLM's CPU engine: tensor_parallel_size=2 with the multiprocessing executor
(one worker process and one core per rank). Greedy ids of the tp=2 engine must equal the HF SwiftKV
model's (fp32), which the tp=1 engine is held to in test_vllm_model.py. Llama G=2 splits its 2 KV
heads over the ranks; Qwen2 G=1 and Qwen3 G=2 have one KV head, so both ranks hold a copy of it
(replication); Qwen3's per-group k_norm_swiftkv and per-layer q_norm_swiftkv are whole on every rank."""

from __future__ import annotations

import pytest

from tests.test_vllm_model import CHUNK, NEW_TOKENS, assert_same_as_hf, tiny_checkpoint, vllm_greedy, words

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(1500)]

ENGINES = [("llama", 2, 2), ("qwen2", 1, 1), ("qwen3", 2, 1)]  # (architecture, G, KV heads)


@pytest.fixture(scope="module", params=ENGINES, ids=[f"{a}-G{g}-kv{k}" for a, g, k in ENGINES])
def served_tp2(request, tmp_path_factory):
    from vllm import LLM

    from swiftkv.vllm.engine import engine_kwargs
    from swiftkv.vllm.env import configure_cpu_env

    arch, group_size, kv_heads = request.param
    path = tmp_path_factory.mktemp(f"tp2_{arch}_g{group_size}")
    model, tokenizer = tiny_checkpoint(path, arch, group_size, kv_heads=kv_heads)
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
        import os

        configure_cpu_env(ranks=2)
        assert "|" in os.environ["VLLM_CPU_OMP_THREADS_BIND"]
        llm = LLM(
            **engine_kwargs(str(path), dtype="float32"),
            tensor_parallel_size=2,
            distributed_executor_backend="mp",
            max_model_len=1024,
            kv_cache_memory_bytes=64 * 2**20,
            max_num_batched_tokens=CHUNK,
            max_num_seqs=8,
            enforce_eager=True,
        )
        yield llm, model, tokenizer
        llm.llm_engine.engine_core.shutdown()
        del llm


def test_tp2_greedy_equals_hf_with_chunked_prefill(served_tp2):
    llm, model, tokenizer = served_tp2
    assert llm.llm_engine.vllm_config.parallel_config.tensor_parallel_size == 2
    prompts = ["The capital of France is", words(300, 1), "Once upon a time", words(150, 2)]
    worst = assert_same_as_hf(vllm_greedy(llm, prompts, NEW_TOKENS), prompts, model, tokenizer)
    assert worst < 1e-3
