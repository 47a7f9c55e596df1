"""`swiftkv convert SRC DST --num-key-value-layers N`: a model of a supported family -> a SwiftKV folder."""

from __future__ import annotations

from ..convert import ConvertSettings, convert
from ..model.families import FAMILY_NAMES
from .options import add_dataclass_options, given_values, source_help


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "convert",
        help=f"turn a {FAMILY_NAMES} model into a SwiftKV model",
        description=f"Add SwiftKV projections to a {FAMILY_NAMES} model and write an HF-format SwiftKV folder "
        "(Snowflake checkpoint format). Give N or F. Example: swiftkv convert smollm2-135m-instruct "
        "out/skv50 --num-key-value-layers 15 --init lstsq",
    )
    parser.add_argument("src", help=source_help())
    parser.add_argument("dst", help="output folder (must not exist unless --force)")
    add_dataclass_options(parser, ConvertSettings)
    parser.set_defaults(func=run)


def run(args) -> int:
    report = convert(ConvertSettings(source=args.src, out=args.dst, **given_values(args, ConvertSettings)))
    print(report.summary())
    print(f"wrote {args.dst}")
    return 0
