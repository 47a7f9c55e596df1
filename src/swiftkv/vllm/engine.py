"""Engine settings shared by `swiftkv serve`, `swiftkv bench` and the tests, so all of them run
SwiftKV the same way."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from ..dtypes import AUTO, dtype_name, resolve_dtype
from .env import configure_cpu_env, engine_core_in_process
from .versions import check_installed_vllm

# KV-sharing fast prefill is what lets prompt tokens skip layers >= N. The plugin's config hook
# switches it on for SwiftKV models anyway; passing it keeps plain-vLLM command lines honest too.
SWIFTKV_ENGINE_ARGS = {"kv_sharing_fast_prefill": True}
# KV-cache memory of the engines swiftkv starts on vLLM's CPU build (serve, bench, the replies stage) when
# the user sets none: that build's own default is a fraction of the host's RAM, which small machines do not
# have to spare. On CUDA vLLM sizes the cache itself (`kv_cache_bytes`).
KV_CACHE_BYTES = 2 * 2**30


def kv_cache_bytes(on_cuda: bool, requested: int | None = None, sized_otherwise: bool = False) -> int | None:
    """The KV-cache memory swiftkv passes to vLLM (None: pass nothing). The user's own size wins
    (`requested`); a user who sized the cache another way (`sized_otherwise`: --gpu-memory-utilization)
    gets nothing added; on CUDA vLLM then sizes it from gpu_memory_utilization (0.9 of the GPU by default,
    less the weights and activations), which a fixed 2 GiB would leave mostly unused; on the CPU build,
    KV_CACHE_BYTES."""
    if requested is not None:
        return requested
    if sized_otherwise or on_cuda:
        return None
    return KV_CACHE_BYTES


def engine_kwargs(model: str, **overrides) -> dict:
    """Keyword arguments for `vllm.LLM` / `EngineArgs`: the hardware's dtype (`auto`: bf16 where it
    is native, fp32 otherwise), SwiftKV's fast prefill, and the caller's overrides (which win). Refuses a
    vLLM outside the supported range here, before the engine starts (`versions`)."""
    check_installed_vllm()
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
