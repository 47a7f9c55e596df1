"""`swiftkv demo` (what `make run` runs): the embedded SmolLM2 as teacher vs SwiftKV, in one run."""

from __future__ import annotations

from ..demo import demo
from .options import add_dtype_option


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="the `make run` demo on the embedded SmolLM2: convert, time prefill, compare answers",
    )
    parser.add_argument("--out", default="runs/demo", help="folder for the converted model and results")
    parser.add_argument("--prompt-tokens", type=int, default=2000)
    parser.add_argument("--question", default="What is the capital of France?")
    add_dtype_option(parser)
    parser.set_defaults(func=run)


def run(args) -> int:
    demo(args.out, args.prompt_tokens, args.question, args.dtype)
    return 0
