"""`swiftkv export SRC OUT`: any model source as a complete HF folder."""

from __future__ import annotations

from ..sources import export
from .options import add_revision_option, source_help


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "export",
        help="write a model (alias, .gguf, folder, Hub repo id) as a plain HF folder",
        description="Write any model source as a complete HF folder, e.g. the embedded SmolLM2 teacher "
        "(swiftkv export smollm2-135m-instruct out/teacher) or a distilled SwiftKV model "
        "(swiftkv export smollm2-135m-instruct-swiftkv50 out/skv50).",
    )
    parser.add_argument("src", help=source_help())
    parser.add_argument("out", help="output folder (must not exist unless --force)")
    parser.add_argument("--force", action="store_true", help="overwrite OUT")
    add_revision_option(parser)
    parser.set_defaults(func=run)


def run(args) -> int:
    print(f"wrote {export(args.src, args.out, force=args.force, revision=args.revision)}")
    return 0
