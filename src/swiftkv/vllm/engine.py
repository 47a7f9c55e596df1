"""Engine settings shared by `swiftkv serve`, `swiftkv bench` and the tests, so all of them run
SwiftKV the same way."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from .env import configure_cpu_env

# KV-sharing fast prefill is what lets prompt tokens skip layers >= N. The plugin's config hook
# switches it on for SwiftKV models anyway; passing it keeps plain-vLLM command lines honest too.
SWIFTKV_ENGINE_ARGS = {"kv_sharing_fast_prefill": True}


def engine_kwargs(model: str, **overrides) -> dict:
    """Keyword arguments for `vllm.LLM` / `EngineArgs`: bf16 (the CPU's fast matmul path), SwiftKV's
    fast prefill, and the caller's overrides (which win)."""
    return {"model": model, "dtype": "bfloat16", "seed": 0, **SWIFTKV_ENGINE_ARGS, **overrides}


@contextlib.contextmanager
def in_process_engine() -> Iterator[None]:
    """Run the engine core inside this process (so a test can reach the model with `apply_model`
    and hooks); restores the previous setting afterwards."""
    configure_cpu_env()
    previous = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
        else:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = previous


def kv_cache_tokens(llm) -> int:
    """KV-cache capacity in tokens of a `vllm.LLM`, as vLLM allocated it (blocks x block size)."""
    cache_config = llm.llm_engine.vllm_config.cache_config
    return int(cache_config.num_gpu_blocks) * int(cache_config.block_size)
