"""`swiftkv serve MODEL [vLLM options]`: vLLM's OpenAI-compatible server for a SwiftKV model."""

from __future__ import annotations

import argparse

from ..vllm.engine import KV_CACHE_BYTES
from ..vllm.serve import serve


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="start vLLM's OpenAI-compatible server for a SwiftKV model",
        description="Start vLLM's OpenAI-compatible server (`vllm serve`) for a SwiftKV folder, alias or Hub repo id (at --revision; vLLM is given its cached folder), with "
        "--kv-sharing-fast-prefill, the hardware's dtype (bf16 where it is native, else fp32) and the KV cache "
        "sized by vLLM on CUDA (--gpu-memory-utilization, 0.9 by default) or, on vLLM's CPU build, "
        f"{KV_CACHE_BYTES // 2**30} GiB (--kv-cache-memory-bytes), with the CPU environment set. Every other option is passed to vLLM unchanged, e.g. "
        "swiftkv serve out/skv50 --port 8001 --api-key KEY",
    )
    parser.add_argument("model", help="SwiftKV HF folder, alias or Hub repo id")
    parser.add_argument(
        "vllm_args", nargs=argparse.REMAINDER, help="options for `vllm serve` (see vllm serve --help)"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    vllm_args = args.vllm_args[1:] if args.vllm_args[:1] == ["--"] else args.vllm_args
    serve(args.model, vllm_args)  # becomes the server; does not return
    return 0
