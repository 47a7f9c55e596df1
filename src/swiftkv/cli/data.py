"""`swiftkv data --data SOURCE[:COUNT] ... --out FILE.jsonl`: a run's data as one chat JSONL file."""

from __future__ import annotations

from pathlib import Path

from ..data.mixture import DATA_HELP, DEFAULT_SPLIT, SPLIT_HELP, write_examples


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "data",
        help="write --data (any record layout, dataset names, sampled counts, several sources) as one chat JSONL",
        description="Read --data as replies and distill do (the same seeded samples) and write its examples as "
        '{"messages": [...]} (or {"text": ...}) lines: a file to keep, copy to another machine or inspect.',
    )
    parser.add_argument("--data", action="append", required=True, metavar="SOURCE[:COUNT]", help=DATA_HELP)
    parser.add_argument("--seed", type=int, default=0, help="the seed of the sampled counts (default 0)")
    parser.add_argument("--data-split", default=DEFAULT_SPLIT, help=SPLIT_HELP)
    parser.add_argument("--out", required=True, help="the JSONL file to write (atomically)")
    parser.set_defaults(func=run)


def run(args) -> int:
    spec = args.data[0] if len(args.data) == 1 else tuple(args.data)
    written = write_examples(spec, Path(args.out), args.seed, args.data_split)
    print(f"wrote {args.out}: {written:,} examples")
    return 0
