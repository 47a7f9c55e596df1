"""`swiftkv bench MODEL --baseline TEACHER [--online]`: SwiftKV vs its baseline on vLLM, one run, same
settings. Offline (default): engines in-process, fixed batches. `--online`: both models behind vLLM's
OpenAI server under Poisson request arrivals. The options are generated from
`swiftkv.bench.offline.BenchSettings` (both modes) and `swiftkv.bench.online.OnlineSettings` (--online).
`--profile`: one mixed prefill/decode step of each model under torch's profiler (`swiftkv.bench.profile`).
`--decode-steps`: many decode-only steps of each model timed one by one (`swiftkv.bench.profile.decode_steps`).
`--moe`: no models given; the prefill ratio of a random Qwen3-30B-A3B-shaped teacher and its SwiftKV student
against its FLOP bound (`swiftkv.bench.moe`)."""

from __future__ import annotations

import argparse
import dataclasses

from ..bench.moe import MoeShape, moe_bench
from ..bench.moe import format_table as format_moe_table
from ..bench.offline import BenchSettings, bench, format_table
from ..bench.online import OnlineSettings, online_bench, online_settings
from ..bench.online_report import format_table as format_online_table
from ..bench.profile import DecodeScenario, Scenario, decode_steps, format_decode_steps, profile
from ..bench.profile import format_table as format_profile_table
from ..vllm.speculative import NGRAM_EXAMPLE
from .options import add_dataclass_options, given_values, option_name


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="SwiftKV vs baseline on vLLM: prefill, TTFT, TPOT, 10:1 throughput, KV capacity; "
        "--online: served under Poisson load",
        description="Benchmark a SwiftKV model against its baseline on vLLM in one run with identical settings; "
        "prints a table of baseline, SwiftKV and ratio, writes OUT/bench.json and OUT/bench.png. With --online, "
        "serves each model with vLLM's OpenAI server in turn (the baseline as plain vLLM, SwiftKV via "
        "`swiftkv serve`), sends Poisson-timed 10:1 requests at several rates, and writes OUT/online.json and "
        "OUT/online.png.",
    )
    parser.add_argument("model", nargs="?", help="SwiftKV HF folder, alias or Hub repo id (none with --moe)")
    parser.add_argument(
        "--baseline", help="the original model (HF folder, .gguf, alias or Hub repo id; none with --moe)"
    )
    add_dataclass_options(parser, BenchSettings)
    online = parser.add_argument_group("online benchmark (--online)")
    online.add_argument(
        "--online",
        action="store_true",
        help="serve both models with vLLM's OpenAI server and measure them under Poisson load",
    )
    add_dataclass_options(online, OnlineSettings)
    parser.add_argument(
        "--profile",
        action="store_true",
        help="instead of the benchmark: where one mixed prefill/decode step's time goes in each "
        "model (torch profiler; 8 decoding requests + one 2000-token prompt), written to "
        "OUT/profile.json",
    )
    parser.add_argument(
        "--decode-steps",
        action="store_true",
        help="instead of the benchmark: time many decode-only steps of each model (8 sequences of "
        "2000 prompt tokens, 128 steps; median per step and the SwiftKV / baseline ratio), written "
        "to OUT/decode-steps.json and OUT/decode-steps.png",
    )
    moe = parser.add_argument_group("Mixture-of-Experts prefill (--moe)")
    moe.add_argument(
        "--moe",
        action="store_true",
        help="instead of the benchmark, with no models given: the prefill throughput of a random-weight "
        "Qwen3-30B-A3B-shaped teacher (fewer layers and experts) and its SwiftKV student at N = L/2, interleaved, "
        "against the FLOP bound of their ratio; written to OUT/bench-moe.json and OUT/bench-moe.png",
    )
    # MoeShape's prompt_len, prompts and repeats would share argparse's dest with the online options'
    add_dataclass_options(moe, MoeShape, dest_prefix=MOE_DEST)
    parser.set_defaults(func=run)


MOE_DEST = "moe_shape_"


def chosen_mode(args: argparse.Namespace) -> str | None:
    """The one of --online, --profile, --decode-steps, --moe given (None: the offline benchmark)."""
    modes = [name for name in ("online", "profile", "decode_steps", "moe") if getattr(args, name)]
    if len(modes) > 1:
        raise ValueError(
            f"{' and '.join('--' + m.replace('_', '-') for m in modes)} are separate runs; give one of them"
        )
    return modes[0] if modes else None


def run(args: argparse.Namespace) -> int:
    given = given_values(args, BenchSettings)
    mode = chosen_mode(args)
    check_models(args, mode)
    shape_given = given_values(args, MoeShape, dest_prefix=MOE_DEST)
    if shape_given and mode != "moe":
        names = [option_name(f) for f in dataclasses.fields(MoeShape) if f.name in shape_given]
        raise ValueError(f"{', '.join(names)} only apply with --moe")
    settings = BenchSettings(model=args.model, baseline=args.baseline, **given)
    online_given = given_values(args, OnlineSettings)
    if "workloads" in given and mode:
        raise ValueError(
            "--workloads chooses the offline benchmark's workloads; it does not apply with "
            f"--{mode.replace('_', '-')}"
        )
    if mode == "online":
        return run_online(settings, online_given)
    if online_given:
        names = [option_name(f) for f in dataclasses.fields(OnlineSettings) if f.name in online_given]
        raise ValueError(f"{', '.join(names)} only apply with --online")
    if mode == "profile":
        return run_profile(settings)
    if mode == "decode_steps":
        return run_decode_steps(settings)
    if mode == "moe":
        return run_moe(settings, shape_given)
    report = bench(settings)
    print(format_table(report))
    print(f"wrote {settings.out}/bench.json and {settings.out}/bench.png")
    return 0


def check_models(args: argparse.Namespace, mode: str | None) -> None:
    """MODEL and --baseline for every mode but --moe, which builds its own models and takes neither."""
    if mode == "moe" and (args.model or args.baseline):
        raise ValueError("--moe benchmarks random models of its own shape; give no MODEL or --baseline")
    if mode != "moe" and not (args.model and args.baseline):
        raise ValueError("swiftkv bench needs MODEL (the SwiftKV model) and --baseline (its source model)")


def run_moe(settings: BenchSettings, shape_given: dict) -> int:
    shape = MoeShape.quick() if settings.quick else MoeShape()
    report = moe_bench(settings, dataclasses.replace(shape, **shape_given))
    print(format_moe_table(report))
    print(f"wrote {settings.out}/bench-moe.json and {settings.out}/bench-moe.png")
    return 0


def run_online(settings: BenchSettings, online_given: dict) -> int:
    if "speculate" in online_given and "speculative_config" not in online_given:
        raise ValueError(
            "--speculate says which servers get --speculative-config; give the config too, e.g. "
            f"--speculative-config '{NGRAM_EXAMPLE}'"
        )
    report = online_bench(settings, online_settings(online_given, settings.quick))
    print(format_online_table(report))
    print(f"wrote {settings.out}/online.json and {settings.out}/online.png")
    return 0


def run_profile(settings: BenchSettings) -> int:
    scenario = Scenario.quick() if settings.quick else Scenario()
    report = profile(settings, scenario)
    print(format_profile_table(report))
    print(f"wrote {settings.out}/profile.json")
    return 0


def run_decode_steps(settings: BenchSettings) -> int:
    scenario = DecodeScenario.quick() if settings.quick else DecodeScenario()
    report = decode_steps(settings, scenario)
    print(format_decode_steps(report))
    print(f"wrote {settings.out}/decode-steps.json and {settings.out}/decode-steps.png")
    return 0
