"""Engine settings shared by `swiftkv serve`, `swiftkv bench` and the tests, so all of them run
SwiftKV the same way."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from ..dtypes import AUTO, dtype_name, resolve_dtype
from .env import configure_cpu_env, engine_core_in_process

# KV-sharing fast prefill is what lets prompt tokens skip layers >= N. The plugin's config hook
# switches it on for SwiftKV models anyway; passing it keeps plain-vLLM command lines honest too.
SWIFTKV_ENGINE_ARGS = {"kv_sharing_fast_prefill": True}
# KV-cache memory of every engine swiftkv starts (serve, the replies stage): on CPU the default is a
# fraction of RAM, which the 2-core machines this targets do not have to spare.
KV_CACHE_BYTES = 2 * 2**30


def engine_kwargs(model: str, **overrides) -> dict:
    """Keyword arguments for `vllm.LLM` / `EngineArgs`: the hardware's dtype (`auto`: bf16 where it
    is native, fp32 otherwise), SwiftKV's fast prefill, and the caller's overrides (which win)."""
    return {
        "model": model,
        "dtype": dtype_name(resolve_dtype(AUTO)),
        "seed": 0,
        **SWIFTKV_ENGINE_ARGS,
        **overrides,
    }


@contextlib.contextmanager
def in_process_engine() -> Iterator[None]:
    """Run the engine core inside this process (so a test can reach the model with `apply_model`
    and hooks); restores the previous setting afterwards."""
    configure_cpu_env()
    with engine_core_in_process():
        yield


def kv_cache_tokens(llm) -> int:
    """KV-cache capacity in tokens of a `vllm.LLM`, as vLLM allocated it (blocks x block size)."""
    cache_config = llm.llm_engine.vllm_config.cache_config
    return int(cache_config.num_gpu_blocks) * int(cache_config.block_size)
