"""`swiftkv eval MODEL [MODEL ...] --teacher TEACHER`: what quality a SwiftKV model kept, offline."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
from transformers.utils import logging as hf_logging

from ..dtypes import describe_choice
from ..evaluate.processes import launched_processes, start_processes
from ..evaluate.report import write_report
from ..evaluate.run import evaluate_models, open_models
from ..evaluate.settings import EvalSettings, SweepSettings, non_negative
from ..evaluate.sweep import run_sweep
from .options import add_dataclass_options, given_values


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "eval",
        help="compare SwiftKV models with their teacher (lm-eval tasks + held-out chat agreement)",
        description="Score each MODEL and TEACHER on lm-eval multiple-choice tasks (offline data), held-out "
        "ShareGPT chat (teacher-forced KL / top-1 agreement), greedy generation and, with --long-qa, answers to "
        "questions over passages scored against their gold answers; write report.md, "
        "report.png and results.json to --out. Results are cached: re-runs and a teacher shared by "
        "several models recompute nothing. Example: swiftkv eval out/skv50 out/skv25 "
        "--teacher smollm2-135m-instruct --limit hellaswag=2000,mmlu=2000",
    )
    parser.add_argument(
        "models",
        nargs="+",
        metavar="MODEL",
        help="SwiftKV model(s): HF folder, alias (smollm2-135m-instruct-swiftkv50, ...) or Hub repo id; with "
        "--sweep, the source model to convert",
    )
    add_dataclass_options(parser, EvalSettings)
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch CPU threads (default: torch's; 1 is faster when other jobs load the cores)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    add_dataclass_options(parser.add_argument_group("trade-off sweep"), SweepSettings)
    parser.set_defaults(func=run)


def run(args) -> int:
    hf_logging.disable_progress_bar()  # per-file weight-loading bars would drown the scoring progress
    settings = EvalSettings(
        students=args.models, **given_values(args, EvalSettings), progress=not args.no_progress
    )
    sweep = SweepSettings(**given_values(args, SweepSettings))
    if args.threads:
        torch.set_num_threads(non_negative("--threads", args.threads, allow_zero=False))
    if settings.teacher is None and len(args.models) > 1 and not sweep.sweep:
        raise ValueError("several MODELs need --teacher (the model they were all converted from)")
    if sweep.sweep and launched_processes() > 1:
        raise ValueError("--sweep runs in one process; run it without torchrun / accelerate launch")
    models = None if sweep.sweep else open_models(settings)  # before the process group: see open_models
    processes = start_processes(settings.device)
    if processes.is_main:
        print(
            f"swiftkv eval: {processes.size} process(es) on {processes.device.type}, "
            f"{describe_choice(settings.dtype, processes.device)}",
            file=sys.stderr,
        )
    started = time.time()
    if sweep.sweep:
        paths = run_sweep(settings, sweep)
    else:
        results = evaluate_models(settings, processes, models)
        if processes.size > 1:
            print(
                f"process {processes.rank} of {processes.size}: {processes.units} units of work",
                file=sys.stderr,
            )
        if not processes.is_main:  # every process holds the same results; the first one writes them
            return 0
        paths = write_report(results, Path(settings.out))
    print(f"wrote {', '.join(map(str, paths))} ({time.time() - started:.0f} s)")
    return 0
