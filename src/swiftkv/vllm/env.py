"""Process environment for vLLM's engines: the CPU engine's threads and, on CUDA, the model runner a
SwiftKV engine runs. Set before vLLM is imported or an engine started: the engine core is a child
process that inherits it. The vLLM glue writes os.environ only here."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, MutableMapping


def cpu_list_string(cpus: list[int]) -> str:
    return ",".join(str(c) for c in cpus)


def thread_binding(cpus: list[int], ranks: int) -> str:
    """vLLM-CPU's binding for `ranks` tensor-parallel workers: the CPUs split into that many
    contiguous groups, one per rank, separated by '|'."""
    if ranks > len(cpus):
        raise ValueError(
            f"tensor_parallel_size={ranks} needs at least {ranks} CPUs on vLLM's CPU engine (one "
            f"per rank); this process may use {len(cpus)}"
        )
    share = len(cpus) // ranks
    return "|".join(cpu_list_string(cpus[r * share : (r + 1) * share]) for r in range(ranks))


def configure_cpu_env(environ: MutableMapping[str, str] | None = None, ranks: int = 1) -> dict[str, str]:
    """Use every CPU this process may run on, split between `ranks` tensor-parallel workers, and
    reserve none for the front end (vLLM's default reserves one core, a large share of a machine
    with few cores). Values the user set are kept, except the invalid "all" for the thread binding
    (vLLM accepts "auto", "nobind" or a CPU list). Returns the values in effect."""
    environ = os.environ if environ is None else environ
    if environ.get("VLLM_CPU_OMP_THREADS_BIND", "") in ("", "all"):
        environ["VLLM_CPU_OMP_THREADS_BIND"] = thread_binding(sorted(os.sched_getaffinity(0)), ranks)
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


@contextlib.contextmanager
def engine_core_in_process(environ: MutableMapping[str, str] | None = None) -> Iterator[None]:
    """For the block, make vLLM run its engine core in the calling process instead of a child
    (VLLM_ENABLE_V1_MULTIPROCESSING=0); the previous value is restored afterwards."""
    environ = os.environ if environ is None else environ
    key = "VLLM_ENABLE_V1_MULTIPROCESSING"
    previous = environ.get(key)
    environ[key] = "0"
    try:
        yield
    finally:
        if previous is None:
            environ.pop(key, None)
        else:
            environ[key] = previous


# From 0.27 on, vLLM's CUDA engine defaults to its V2 model runner, which serves kv_sharing_fast_prefill
# through other code than the V1 runner the plugin was written against (the CPU engine has only V1; what
# was read of V2 is in docs/serving.md). Until a GPU check covers it, a SwiftKV engine on CUDA runs V1:
# never a silent fallback to every row through the later layers, nor logits on rows the plugin did not pick.
# From 0.34 on V1 is gone and vLLM refuses RUNNER_ENV=0, so on such a vLLM (run only with the version
# override) the variable is left alone.
RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"


def choose_model_runner(environ: MutableMapping[str, str], on_cuda: bool, has_v1_runner: bool) -> bool:
    """On CUDA, make the engine run vLLM's V1 model runner (RUNNER_ENV=0); returns whether this call chose
    it. A V2 runner asked for explicitly is refused. Nothing to do on a CPU before 0.34 (V1 only), nor on a
    vLLM that has no V1 runner (`versions.has_v1_runner`): V2 is then the only runner."""
    if not on_cuda or not has_v1_runner:
        return False
    asked = environ.get(RUNNER_ENV, "").strip().lower()
    if asked in ("1", "true"):
        raise ValueError(
            f"{RUNNER_ENV}={environ[RUNNER_ENV]}: SwiftKV is verified on vLLM's V1 model runner only "
            "(its fast-prefill path is the one the plugin was written against); unset it or set it to 0"
        )
    if asked in ("0", "false"):
        return False
    environ[RUNNER_ENV] = "0"
    return True
