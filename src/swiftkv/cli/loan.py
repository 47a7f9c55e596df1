"""`swiftkv loan stage|stash|run|install|replies|unstash`: students trained inside one lent GPU (see swiftkv/loan/)."""

from __future__ import annotations

import json
from pathlib import Path

from ..loan.replies import merge_loan_replies
from ..loan.snapshot import install
from ..loan.stage import StageSettings, write_stage
from ..loan.students import LoanSettings, run_loan
from ..loan.tree import STASH_DIR, stash, travelling_tree_mib, unstash
from .options import add_dataclass_options, given_values, source_help


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "loan",
        help="train students inside one lent GPU: stage here, run there, install what came back",
        description="A GPU loan's three steps: `stage` (here, on a CPU) writes the teacher, the train prompts and "
        "the calibration and held-out blocks into two parts, one per transfer; `run` (on the GPU, or --device cpu "
        "as a dry-run) writes the teacher's replies, measures the trainer on an 8B shape and trains every student "
        "in parallel, snapshotting each at least every 2 minutes; `install` turns a snapshot into a distilled "
        "HF folder; `replies` merges the loan's replies into a reply file that CPU runs and the next stage "
        "read. `stash` / `unstash` move what the box never reads out of the checkout and back, since every "
        "call carries the checkout beside its part.",
    )
    steps = parser.add_subparsers(dest="step", metavar="STEP", required=True)
    stage = steps.add_parser("stage", help="stage a loan's inputs (CPU)")
    stage.add_argument("teacher", help=source_help())
    add_dataclass_options(stage, StageSettings)
    stage.set_defaults(func=run_stage)
    for name, func, what in (
        (
            "stash",
            run_stash,
            "move what the box never reads (shipped weights, docs' records) out of the checkout",
        ),
        ("unstash", run_unstash, "put a stash back into the checkout"),
    ):
        step = steps.add_parser(name, help=f"{what} (before / after a loan)")
        step.add_argument(
            "--dir", default=str(STASH_DIR), help=f"where the stash lives (default {STASH_DIR})"
        )
        step.set_defaults(func=func)
    run = steps.add_parser("run", help="the loan itself (GPU; --device cpu for the dry-run)")
    run.add_argument("stage", help="the stage folder (part1/ and part2/)")
    add_dataclass_options(run, LoanSettings)
    run.set_defaults(func=run_run)
    put = steps.add_parser("install", help="a student snapshot -> a distilled HF SwiftKV folder")
    put.add_argument("snapshot", help="a student's folder of a loan's output (n15/, n22/, ...)")
    put.add_argument("--out", required=True, help="the distilled folder (written atomically)")
    put.add_argument("--teacher", default=None, help="the teacher here (default: the one the snapshot names)")
    put.add_argument("--force", action="store_true", help="overwrite --out")
    put.set_defaults(func=run_install)
    keep = steps.add_parser(
        "replies", help="a loan's replies -> a reply file distill and the next stage read"
    )
    keep.add_argument("loan_out", help="a loan's output folder (its replies.npz.xz)")
    keep.add_argument("--stage", required=True, help="the stage that loan ran on (its part2/prompts.npz.xz)")
    keep.add_argument(
        "--into",
        required=True,
        help="the reply file to merge into (created if missing; its records kept first; .xz compressed)",
    )
    keep.set_defaults(func=run_replies)


def run_stage(args) -> int:
    manifest = write_stage(StageSettings(teacher=args.teacher, **given_values(args, StageSettings)))
    print(json.dumps({k: manifest[k] for k in ("prompts", "tree_mib", "parts_mib")}))
    return 0


def run_stash(args) -> int:
    moved = stash(to=Path(args.dir))
    print(
        f"moved {len(moved)} files to {args.dir}; {travelling_tree_mib():.1f} MiB of the checkout travels now. "
        "git status lists them as deleted until `swiftkv loan unstash`"
    )
    return 0


def run_unstash(args) -> int:
    print(f"put back {len(unstash(frm=Path(args.dir)))} files from {args.dir}")
    return 0


def run_run(args) -> int:
    report = run_loan(LoanSettings(stage=args.stage, **given_values(args, LoanSettings)))
    print(
        json.dumps(
            {"students": report.students, "shape": report.shape, "replies": report.replies}, default=str
        )[:4000]
    )
    return 0


def run_install(args) -> int:
    print(f"wrote {install(args.snapshot, args.out, args.teacher, args.force)}")
    return 0


def run_replies(args) -> int:
    print(json.dumps(merge_loan_replies(Path(args.loan_out), Path(args.stage), Path(args.into))))
    return 0
