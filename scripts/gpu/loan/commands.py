"""The steps of `python -m loan` (from scripts/gpu): students trained on a rented GPU.

stage    here, on a CPU: the teacher, the train prompts and the calibration and held-out blocks, in two
         parts of at most stage.TRANSFER_MIB beside the checkout
run      on the GPU (--device cpu: the dry-run the suite runs): the teacher's replies, the trainer on an
         8B shape, every student in parallel, each snapshotted at least every --snapshot-seconds; exits 1
         when a student or the shape measurement fails, 3 when an import it needs fails, 4 when its
         output folder breaks outputs.py's limits
install  here again: a student's snapshot -> a distilled HF SwiftKV folder
replies  here again: the run's replies merged into a reply file `swiftkv distill --teacher-data` reads
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from outputs import check_outputs

from swiftkv.cli.options import add_dataclass_options, given_values, source_help
from swiftkv.distill import install

from .replies import merge_loan_replies
from .stage import StageSettings, write_stage
from .students import LoanSettings, run_loan

PROG = "python -m loan"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Students trained on a rented GPU: stage here, run there, install what came back.",
    )
    steps = parser.add_subparsers(dest="step", metavar="STEP", required=True)
    stage = steps.add_parser("stage", help="stage the run's inputs (CPU)")
    stage.add_argument("teacher", help=source_help())
    add_dataclass_options(stage, StageSettings)
    stage.set_defaults(func=run_stage)
    run = steps.add_parser("run", help="the GPU run itself (--device cpu for the dry-run)")
    run.add_argument("stage", help="the stage folder (part1/ and part2/)")
    add_dataclass_options(run, LoanSettings)
    run.set_defaults(func=run_run)
    put = steps.add_parser("install", help="a student snapshot -> a distilled HF SwiftKV folder")
    put.add_argument("snapshot", help="a student's folder of a run's output (n15/, n22/, ...)")
    put.add_argument("--out", required=True, help="the distilled folder (written atomically)")
    put.add_argument("--teacher", default=None, help="the teacher here (default: the one the snapshot names)")
    put.add_argument("--force", action="store_true", help="overwrite --out")
    put.set_defaults(func=run_install)
    keep = steps.add_parser("replies", help="a run's replies -> a reply file distill and the next stage read")
    keep.add_argument("run_out", help="a run's output folder (its replies.npz.xz)")
    keep.add_argument("--stage", required=True, help="the stage that run ran on (its part2/prompts.npz.xz)")
    keep.add_argument(
        "--into",
        required=True,
        help="the reply file to merge into (created if missing; its records kept first; .xz compressed)",
    )
    keep.set_defaults(func=run_replies)
    return parser


def run_stage(args) -> int:
    manifest = write_stage(StageSettings(teacher=args.teacher, **given_values(args, StageSettings)))
    print(json.dumps({k: manifest[k] for k in ("prompts", "tree_mib", "parts_mib")}))
    return 0


def run_run(args) -> int:
    settings = LoanSettings(stage=args.stage, **given_values(args, LoanSettings))
    report = run_loan(settings)
    print(
        json.dumps(
            {"students": report.students, "shape": report.shape, "replies": report.replies}, default=str
        )[:4000]
    )
    failed = [f"N = {n}" for n, student in report.students.items() if student.get("exit") != 0]
    failed += ["the shape"] if report.shape and report.shape.get("error") else []
    if failed:
        print(f"{PROG} run: failed: {', '.join(failed)}", file=sys.stderr)
    return check_outputs(Path(settings.out), f"{PROG} run") or (1 if failed else 0)


def run_install(args) -> int:
    print(f"wrote {install(args.snapshot, args.out, args.teacher, args.force)}")
    return 0


def run_replies(args) -> int:
    print(json.dumps(merge_loan_replies(Path(args.run_out), Path(args.stage), Path(args.into))))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError, FileExistsError) as error:  # bad input: one line
        print(f"{PROG} {args.step}: error: {str(error).replace(chr(10), ' ')}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
