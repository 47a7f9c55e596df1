"""Knowledge-preserving distillation of SwiftKV students: the settings, the run, the training core, the ways
a run starts, parallelism and the measuring wing.

Code outside this package (the CLI, scripts) imports from `swiftkv.distill` itself, never from its
subpackages: the names below are the package's API, and the modules behind them may move. They load on first
use, so `import swiftkv.distill` costs nothing and no subpackage is imported before it is needed.
"""

from __future__ import annotations

import importlib

# Public name -> the module (under swiftkv.distill) that defines it.
API: dict[str, str] = {
    # One run as a library call, and its settings.
    **dict.fromkeys(("run_distillation", "heldout_agreement", "DistillResult"), "run"),
    **dict.fromkeys(("DistillSettings", "settings_for", "default_recipe", "RECIPES", "SECTIONS"), "settings"),
    # The pieces of a training step, for a loop of one's own (a deadline-driven run, a shape probe).
    **dict.fromkeys(("Prepared", "prepare", "train_step", "evaluate", "lr_at"), "core.trainer"),
    "BatchSizes": "core.loss",
    "load_trained_set": "core.trainable",
    **dict.fromkeys(("AUTO", "parse_micro_batch"), "core.microbatch"),
    **dict.fromkeys(("compiled_artifacts", "load_compiled_artifacts", "reason_of"), "core.compiled"),
    **dict.fromkeys(("World", "launched_as_main"), "parallel.world"),
    # How a run starts: trained snapshots, folders with given weights, the CPU threads.
    **dict.fromkeys(
        ("install", "read_progress", "read_snapshot", "write_snapshot", "snapshot_teacher"),
        "start.snapshot",
    ),
    **dict.fromkeys(("folder_spec", "is_snapshot", "with_folder_rank"), "start.from_weights"),
    "set_threads": "start.setup",
    # The measuring wing: plan, speed, compute bound, profile, the replies' time.
    **dict.fromkeys(("PlanRequest", "model_parameters", "print_plan"), "measure.plan"),
    **dict.fromkeys(
        (
            "TIMED_STEPS",
            "HOURS_PER_100M",
            "measure_shared_vs_naive",
            "peak_memory_mib",
            "random_blocks",
        ),
        "measure.speed",
    ),
    **dict.fromkeys(
        ("bound_line", "bound_of", "compute_bound", "device_peak", "step_flops_per_token"),
        "measure.bound",
    ),
    "profile_steps": "measure.profile",
    "plan_replies": "measure.replies_time",
}

__all__ = sorted(API)


def __getattr__(name: str):
    module = API.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # found once, then an ordinary module attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(API))
