"""Process environment for vLLM's CPU engine. Set before vLLM is imported or an engine started:
the engine core is a child process that inherits it."""

from __future__ import annotations

import os
from collections.abc import MutableMapping


def cpu_list_string(cpus: list[int]) -> str:
    return ",".join(str(c) for c in cpus)


def configure_cpu_env(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Use every CPU this process may run on and reserve none for the front end (vLLM's default
    reserves one core, which is half of a 2-core machine). Values the user set are kept, except
    the invalid "all" for the thread binding (vLLM accepts "auto", "nobind" or a CPU list). Returns
    the values in effect."""
    environ = os.environ if environ is None else environ
    if environ.get("VLLM_CPU_OMP_THREADS_BIND", "") in ("", "all"):
        environ["VLLM_CPU_OMP_THREADS_BIND"] = cpu_list_string(sorted(os.sched_getaffinity(0)))
    defaults = {
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    for key, value in defaults.items():
        environ.setdefault(key, value)
    keys = ("VLLM_CPU_OMP_THREADS_BIND", *defaults)
    return {key: environ[key] for key in keys}
