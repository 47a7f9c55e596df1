"""`--kv-cache-dtype` beside SwiftKV, checked before the engine starts (importable without vLLM).

vLLM 0.32's CPU attention (`v1/attention/backends/cpu_attn.py`) stores its cache as `auto` (the model
dtype), or as 8-bit floats: `fp8` (= `fp8_e4m3`) or `fp8_e5m2`, with per-layer scales k_scale / v_scale.
Its fp8 kernels need x86 with AVX-512 or AMX and a head size divisible by 32. Any other value would
fail inside the engine after the model loaded; here it is one error listing the valid values.

SwiftKV's KV holders (`layers.KVHolder`) are ordinary `Attention` modules, so their caches take the
same dtype: `unified_kv_cache_update` quantizes each group's K/V with the holder's scales, and the later
layers read it with their own, which are equal (1.0 for every SwiftKV checkpoint: they carry no KV
scales, and vLLM's default is 1.0).
"""

from __future__ import annotations

import torch

# CPUAttentionBackend.supported_kv_cache_dtypes in vLLM 0.32 (kept in step with it by a test).
CPU_KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")
FP8_HEAD_SIZE_MULTIPLE = 32


def is_fp8(kv_cache_dtype: str) -> bool:
    return kv_cache_dtype.startswith("fp8")


def cpu_has_fp8_kernels() -> bool:
    """vLLM-CPU's fp8 attention needs AVX-512 or AMX (its `_get_attn_isa`)."""
    return bool(torch.cpu._is_avx512_supported() or torch.cpu._is_amx_tile_supported())


def check_kv_cache_dtype(
    kv_cache_dtype: str | None, head_dim: int | None = None, fp8_kernels: bool | None = None
) -> None:
    """One ValueError for a KV-cache dtype vLLM's CPU engine cannot run (None: the default, auto)."""
    if kv_cache_dtype is None or kv_cache_dtype == "auto":
        return
    if kv_cache_dtype not in CPU_KV_CACHE_DTYPES:
        raise ValueError(
            f"--kv-cache-dtype {kv_cache_dtype!r} is not supported by vLLM's CPU attention; expected "
            f"one of {', '.join(CPU_KV_CACHE_DTYPES)}"
        )
    fp8_kernels = cpu_has_fp8_kernels() if fp8_kernels is None else fp8_kernels
    if not fp8_kernels:
        raise ValueError(
            f"--kv-cache-dtype {kv_cache_dtype} needs a CPU with AVX-512 or AMX (vLLM's fp8 attention "
            "kernels); this CPU has neither: use --kv-cache-dtype auto"
        )
    if head_dim is not None and head_dim % FP8_HEAD_SIZE_MULTIPLE:
        raise ValueError(
            f"--kv-cache-dtype {kv_cache_dtype} needs a head size divisible by "
            f"{FP8_HEAD_SIZE_MULTIPLE} on vLLM's CPU engine; this model's is {head_dim}: use "
            "--kv-cache-dtype auto"
        )
