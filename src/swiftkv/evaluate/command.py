"""`swiftkv eval`: what quality a SwiftKV model kept, measured against its teacher, offline."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from .harness import MAIN_TASKS

DTYPES = ("bfloat16", "float32")


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "eval", help="compare SwiftKV models with their teacher (lm-eval tasks + held-out chat agreement)",
        description="Score each MODEL and TEACHER on lm-eval multiple-choice tasks (offline data), held-out "
        "ShareGPT chat (teacher-forced KL / top-1 agreement) and greedy generation; write report.md, "
        "report.png and results.json to --out. Results are cached: re-runs and a teacher shared by "
        "several models recompute nothing. Example: swiftkv eval out/skv50 out/skv25 "
        "--teacher smollm2-135m-instruct --limit hellaswag=2000,mmlu=2000",
    )
    parser.add_argument("models", nargs="+", metavar="MODEL",
                        help="SwiftKV model(s): HF folder or alias (smollm2-135m-instruct-swiftkv50, ...); with "
                        "--sweep, the source model to convert")
    parser.add_argument("--teacher", default=None,
                        help="the model the students came from (folder or alias, e.g. smollm2-135m-instruct); "
                        "default: each MODEL's own teacher path (swiftkv off)")
    parser.add_argument("--tasks", default=",".join(MAIN_TASKS),
                        help=f"comma-separated lm-eval tasks (default: {','.join(MAIN_TASKS)}; also mmlu_<subject>)")
    parser.add_argument("--limit", default=None,
                        help="items per task: N for every task, or task=N,... (e.g. hellaswag=2000,mmlu=2000); "
                        "for mmlu, N is spread evenly over its 57 subjects")
    parser.add_argument("--chat-conversations", type=int, default=100,
                        help="held-out ShareGPT conversations for teacher-forced KL/top-1 (0 skips; max 497)")
    parser.add_argument("--chat-max-tokens", type=int, default=512, help="tokens per conversation (default 512)")
    parser.add_argument("--gen-prompts", type=int, default=32, help="held-out prompts for greedy generation (0 skips)")
    parser.add_argument("--gen-tokens", type=int, default=32, help="tokens generated per prompt (default 32)")
    parser.add_argument("--dtype", choices=DTYPES, default="bfloat16",
                        help="inference dtype (default bfloat16: measured to keep answers, see docs/evaluation.md)")
    parser.add_argument("--batch-tokens", type=int, default=4096, help="padded tokens per scoring batch")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (default: torch's; 1 is faster when other jobs load the cores)")
    parser.add_argument("--out", default="swiftkv-eval", help="report folder (default ./swiftkv-eval)")
    parser.add_argument("--cache", default=None, help="results cache file (default ~/.cache/swiftkv/eval/results.sqlite)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    sweep = parser.add_argument_group("trade-off sweep")
    sweep.add_argument("--sweep", default=None, metavar="FRACTIONS",
                       help="convert MODEL with these SwiftKV fractions (e.g. 25%%,40%%,50%%) and plot agreement "
                       "against prefill-compute saving")
    sweep.add_argument("--sweep-group-sizes", default="1", metavar="G,...", help="AcrossKV group sizes to sweep")
    sweep.add_argument("--sweep-init", choices=("copy", "mean", "lstsq"), default="lstsq", help="conversion init")
    parser.set_defaults(func=run_eval)


def positive(name: str, value: int, allow_zero: bool = True) -> int:
    if value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{name} {value} is invalid; expected a {'non-negative' if allow_zero else 'positive'} integer")
    return value


def settings_from_args(args: argparse.Namespace):
    import torch

    from .harness import parse_limits, parse_tasks
    from .run import EvalSettings

    tasks = parse_tasks(args.tasks)
    return EvalSettings(
        tasks=tasks, limits=parse_limits(args.limit, tasks), dtype=getattr(torch, args.dtype),
        batch_tokens=positive("--batch-tokens", args.batch_tokens, allow_zero=False),
        chat_conversations=positive("--chat-conversations", args.chat_conversations),
        chat_max_tokens=positive("--chat-max-tokens", args.chat_max_tokens, allow_zero=False),
        gen_prompts=positive("--gen-prompts", args.gen_prompts),
        gen_tokens=positive("--gen-tokens", args.gen_tokens, allow_zero=False),
        progress=not args.no_progress,
    )


def run_eval(args: argparse.Namespace) -> int:
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # per-file weight-loading bars would drown the scoring progress
    if args.threads:
        torch.set_num_threads(positive("--threads", args.threads, allow_zero=False))
    settings = settings_from_args(args)
    if args.teacher is None and len(args.models) > 1 and not args.sweep:
        raise ValueError("several MODELs need --teacher (the model they were all converted from)")
    started = time.time()
    if args.sweep:
        from .sweep import run_sweep

        paths = run_sweep(args.models, args, settings)
    else:
        from .report import write_report
        from .run import evaluate_models

        results = evaluate_models(args.models, args.teacher, settings, Path(args.cache) if args.cache else None)
        paths = write_report(results, Path(args.out))
    print(f"wrote {', '.join(map(str, paths))} ({time.time() - started:.0f} s)")
    return 0
