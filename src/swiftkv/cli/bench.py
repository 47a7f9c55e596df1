"""`swiftkv bench MODEL --baseline TEACHER`: SwiftKV vs its baseline on vLLM, one run, same settings.
The options are generated from `swiftkv.vllm.bench.BenchSettings`."""

from __future__ import annotations

import argparse

from ..vllm.bench import BenchSettings
from .options import add_dataclass_options, given_values


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "bench", help="SwiftKV vs baseline on vLLM: prefill, TTFT, TPOT, 10:1 throughput, KV capacity",
        description="Benchmark a SwiftKV model against its baseline on vLLM in one run with identical settings; "
        "prints a table of baseline, SwiftKV and ratio, writes OUT/bench.json and OUT/bench.png.",
    )
    parser.add_argument("model", help="SwiftKV HF folder or alias")
    parser.add_argument("--baseline", required=True, help="the original model (HF folder, .gguf or alias)")
    add_dataclass_options(parser, BenchSettings)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..vllm.bench import bench, format_table

    settings = BenchSettings(**given_values(args, BenchSettings))
    report = bench(args.model, args.baseline, settings)
    print(format_table(report))
    print(f"wrote {settings.out}/bench.json and {settings.out}/bench.png")
    return 0
