"""The users' number: `swiftkv distill`'s step on a model of a real shape (Llama-3.1-8B by default), with
random weights, so nothing is downloaded: tokens/s, the fraction of the device's matmul peak, peak
memory, and GPU-hours per 100M train tokens.

Random weights give the real step's FLOPs and memory (the shapes are the model's), not its quality. The
blocks are random tokens with a quarter of each block's positions trained, about the reply share of
chat data; `--trainable swiftkv` (the paper's: the SwiftKV projections only) at N = L/2.
`python -m loan.shape --shape llama-3.1-8b --seconds 40 --out shape.json`
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from transformers import LlamaConfig

from swiftkv.distill import (
    HOURS_PER_100M,
    BatchSizes,
    World,
    compute_bound,
    peak_memory_mib,
    prepare,
    random_blocks,
    settings_for,
    train_step,
)
from swiftkv.dtypes import dtype_name, resolve_dtype
from swiftkv.model.families import family_of
from swiftkv.model.surgery import swiftkv_config
from swiftkv.peaks import matmul_peak

# Published shapes (the models' config.json values), and a tiny one for the CPU dry-run.
SHAPES = {
    "llama-3.1-8b": dict(
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        rope_theta=500000.0,
        max_position_embeddings=131072,
        tie_word_embeddings=False,
    ),
    "tiny": dict(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
    ),
}


def random_student(shape: str, device: torch.device, seed: int = 0):
    """A SwiftKV model of `shape` at N = L/2 with random weights (transformers' own init, seeded), built on
    `device` directly."""
    config = swiftkv_config(LlamaConfig(**SHAPES[shape]), SHAPES[shape]["num_hidden_layers"] // 2, 1)
    model_class = family_of("llama").model_class
    torch.manual_seed(seed)
    with torch.device(device):
        return model_class(config).eval()


def measure(
    shape: str,
    seq_len: int,
    batch_size: int,
    seconds: float,
    device: str,
    peak: float | None = None,
    compile_layers: bool = False,
) -> dict:
    """Steps of `batch_size` blocks of `seq_len` tokens until `seconds` of timed steps (at least 3, after
    one warm-up step)."""
    world = World(device=torch.device(device))
    started = time.time()
    model = random_student(shape, world.device)
    built = time.time() - started
    settings = settings_for(
        "random", "swiftkv", seq_len=seq_len, batch_size=batch_size, tokens=seq_len, compile=compile_layers
    )
    dtype = resolve_dtype(settings.parallel.dtype, world.device)
    train = random_blocks(batch_size * 64, seq_len, model.config.vocab_size)
    distiller, optimizer, step_settings, compiled = prepare(settings, model, train, world)
    sync = torch.cuda.synchronize if world.device.type == "cuda" else (lambda: None)
    tokens, timed, step = 0, 0.0, 0
    while step < 4 or (timed < seconds and step < len(train) // batch_size):
        blocks = train.select(slice(step * batch_size, (step + 1) * batch_size))
        began = time.perf_counter()
        compiled.run(
            train_step, distiller, model, optimizer, blocks, BatchSizes.of(blocks), step_settings, world
        )
        sync()
        if step:  # the first step allocates and warms up
            tokens += blocks.num_tokens
            timed += time.perf_counter() - began
        step += 1
    rate = tokens / timed
    bound = compute_bound(model.config, settings, train, rate, dtype, world.device, peak=peak)
    return {
        "shape": shape,
        "num_key_value_layers": model.config.num_key_value_layers,
        "parameters": sum(p.numel() for p in model.parameters()),
        "trained_parameters": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "seq_len": seq_len,
        "batch_size": batch_size,
        "micro_batch": step_settings.micro_batch,
        "compiled": compiled.active,
        "dtype": dtype_name(dtype),
        "device": torch.cuda.get_device_name(world.device) if world.device.type == "cuda" else "cpu",
        "timed_steps": step - 1,
        "tokens_per_second": round(rate, 1),
        "gpu_hours_per_100m_tokens": round(HOURS_PER_100M / rate, 2),
        **bound,
        "peak_memory_mib": peak_memory_mib(world.device),
        "build_seconds": round(built, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loan.shape", description=__doc__)
    parser.add_argument("--shape", default="llama-3.1-8b", choices=sorted(SHAPES))
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--peak-flops", type=float, default=None, help="the device's matmul peak, measured before"
    )
    parser.add_argument("--compile", action="store_true", help="distill's --compile")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    peak = args.peak_flops
    if peak is None:
        peak = matmul_peak(resolve_dtype("auto", torch.device(args.device)), device=args.device)
    result = measure(args.shape, args.seq_len, args.batch_size, args.seconds, args.device, peak, args.compile)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
