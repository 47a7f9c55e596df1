"""`swiftkv` command line. Thin: each subcommand lives in its own module here, which exposes
`register(subparsers)` and sets `func` (parsed args -> exit code) on its parser; the work is done by
library functions that take typed settings (no argparse objects below this package)."""

from __future__ import annotations

import argparse
import importlib
import sys

# Modules that provide subcommands, in the order `--help` lists them. Importing them loads no vLLM,
# lm-eval or other optional heavy dependency: the library functions import those when they run
# (tests/test_layering.py checks it).
COMMAND_MODULES = tuple(
    f"swiftkv.cli.{name}"
    for name in (
        "convert",
        "export",
        "generate",
        "demo",
        "data",
        "replies",
        "distill",
        "eval",
        "serve",
        "bench",
    )
)


class OneLineParser(argparse.ArgumentParser):
    """A usage error is one line, like every other bad input (argparse would print the usage first);
    subcommand parsers inherit the class."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="swiftkv",
        description="SwiftKV: make a decoder LM (Llama, Mistral, Qwen2, Qwen3; see `convert --help`) prefill-fast. Typical flow: "
        "convert -> (replies) -> distill -> eval -> serve/bench. Every stage reads and writes a plain artifact "
        "(an HF folder, a chat JSONL, a results JSON).",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except (ValueError, FileNotFoundError, FileExistsError, NotADirectoryError, PermissionError) as error:
        # Bad input: one clear line, no traceback. Bugs (other exceptions) keep their traceback.
        message = str(error).replace("\n", " ")  # some library messages span lines
        print(f"swiftkv {args.command}: error: {message}", file=sys.stderr)
        return 2
