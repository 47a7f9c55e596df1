"""`swiftkv distill MODEL --data sharegpt --tokens 1M --out OUT` (also under `torchrun --nproc-per-node K`)."""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import fields
from pathlib import Path


def parse_count(text: str) -> int:
    """`1M`, `250k`, `65536` -> int."""
    units = {"k": 1_000, "m": 1_000_000}
    try:
        if text[-1:].lower() in units:
            return int(float(text[:-1]) * units[text[-1].lower()])
        return int(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"{text!r} is not a token count (e.g. 65536, 250k, 1M)") from error


def register(subparsers) -> None:
    from .trainer import DistillSettings

    d = {f.name: f.default for f in fields(DistillSettings) if f.name != "source"}
    p = subparsers.add_parser(
        "distill", help="distill a converted SwiftKV model (teacher = the same weights with swiftkv off)",
        description="Train only the SwiftKV projections and norm_swiftkv so the student matches the teacher. "
        "Layers < N run once for both. Run under `torchrun --nproc-per-node K` for DDP.")
    p.add_argument("model", help="SwiftKV HF folder (from `swiftkv convert`) or alias")
    p.add_argument("--out", help="final HF SwiftKV folder (written atomically); required unless --compare-naive")
    p.add_argument("--data", default=d["data"],
                   help="'sharegpt', a .json/.jsonl chat file, a text folder, or a datasets.save_to_disk folder")
    p.add_argument("--teacher", help="the model MODEL was converted from: checked to match (shapes, tokenizer, weights)")
    p.add_argument("--tokens", type=parse_count, default=d["tokens"], help="train tokens (default %(default)s)")
    p.add_argument("--heldout-tokens", type=parse_count, default=d["heldout_tokens"])
    p.add_argument("--seq-len", type=int, default=d["seq_len"])
    p.add_argument("--batch-size", type=int, default=d["batch_size"], help="blocks per optimizer step (global)")
    p.add_argument("--micro-batch", type=int, default=d["micro_batch"], help="blocks per forward")
    p.add_argument("--lr", type=float, default=d["lr"])
    p.add_argument("--warmup", type=float, default=d["warmup"], help="warmup fraction of the steps")
    p.add_argument("--weight-decay", type=float, default=d["weight_decay"])
    p.add_argument("--temperature", type=float, default=d["temperature"])
    p.add_argument("--mse-weight", type=float, default=d["mse_weight"], help="weight of the hidden-state MSE term")
    p.add_argument("--max-grad-norm", type=float, default=d["max_grad_norm"])
    p.add_argument("--bf16", action="store_true", help="bf16 autocast (fp32 master weights and loss)")
    p.add_argument("--chunk-rows", type=int, default=d["chunk_rows"], help="positions per vocabulary chunk")
    p.add_argument("--naive", action="store_true", help="teacher and student each run all layers (reference way)")
    p.add_argument("--seed", type=int, default=d["seed"])
    p.add_argument("--eval-every", type=int, default=d["eval_every"])
    p.add_argument("--checkpoint-every", type=int, default=d["checkpoint_every"])
    p.add_argument("--checkpoint-dir", help="default: OUT.ckpt")
    p.add_argument("--stop-after", type=int, help="stop (checkpointed) after this many steps")
    p.add_argument("--resume", action="store_true", help="continue from the checkpoint")
    p.add_argument("--force", action="store_true", help="overwrite OUT / start over an existing checkpoint")
    p.add_argument("--compare-naive", type=int, metavar="STEPS",
                   help="measure tokens/s of STEPS steps shared-prefix vs naive, print JSON, train nothing")
    p.add_argument("--eval-only", action="store_true",
                   help="print the held-out KL / top-1 agreement of MODEL on the run's held-out split, train nothing")
    p.add_argument("--json", help="also write the run summary / comparison JSON here")
    p.set_defaults(func=run)


def settings_from_args(args):
    from .trainer import DistillSettings

    return DistillSettings(
        source=args.model, out=args.out, data=args.data, teacher=args.teacher, tokens=args.tokens,
        heldout_tokens=args.heldout_tokens, seq_len=args.seq_len, batch_size=args.batch_size,
        micro_batch=args.micro_batch, lr=args.lr, warmup=args.warmup, weight_decay=args.weight_decay,
        temperature=args.temperature, mse_weight=args.mse_weight, max_grad_norm=args.max_grad_norm,
        bf16=args.bf16, chunk_rows=args.chunk_rows, naive=args.naive, seed=args.seed,
        eval_every=args.eval_every, checkpoint_every=args.checkpoint_every, checkpoint_dir=args.checkpoint_dir,
        stop_after=args.stop_after, resume=args.resume, force=args.force)


def run(args) -> int:
    from .setup import load_student, set_threads
    from .speed import measure_shared_vs_naive
    from .trainer import check_start, distill, finished, init_world, log, run_summary

    settings = settings_from_args(args)
    set_threads()
    if args.compare_naive:
        return report(measure_shared_vs_naive(settings, args.compare_naive), args.json)
    if args.eval_only:
        return report(heldout_agreement(settings), args.json)
    if not settings.out:
        raise ValueError("--out is required: the folder the distilled HF SwiftKV model is written to")
    world = init_world()
    check_start(settings)
    model, tokenizer = load_student(settings)
    started = time.time()
    state = distill(settings, model, tokenizer, world)
    summary = run_summary(settings, state)
    if world.is_main and finished(state):
        write_output(settings, model, tokenizer, summary)
        log(world, f"wrote {settings.out} ({summary['train_tokens']} tokens, {summary['train_seconds']} s train, "
                   f"{time.time() - started:.0f} s this segment)")
    elif world.is_main:
        log(world, f"stopped after step {state.step}; continue with --resume")
    log(world, json.dumps({k: v for k, v in summary.items() if k != "history"}))
    if args.json and world.is_main:
        Path(args.json).write_text(json.dumps(summary, indent=2) + "\n")
    return 0


def write_output(settings, model, tokenizer, summary: dict) -> None:
    """The distilled student as a plain HF SwiftKV folder (swiftkv=True), with the run summary."""
    from ..sources import atomic_output_dir

    model.config.swiftkv = True
    with atomic_output_dir(settings.out, force=True) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (Path(tmp) / "distill.json").write_text(json.dumps(summary, indent=2) + "\n")


def heldout_agreement(settings) -> dict:
    """Held-out KL / top-1 of the model as it is (the split depends on --data, --seed, --heldout-tokens)."""
    from .data import load_blocks
    from .setup import load_student
    from .trainer import World, evaluate

    model, tokenizer = load_student(settings)
    _, heldout = load_blocks(settings.data, tokenizer, settings.seq_len, settings.seq_len, settings.heldout_tokens,
                             settings.seed)
    return {"model": settings.source, "data": settings.data, "heldout_tokens": settings.heldout_tokens,
            **evaluate(model, heldout, settings, World())}


def report(result: dict, json_path: str | None) -> int:
    text = json.dumps(result, indent=2)
    print(text)
    if json_path:
        Path(json_path).write_text(text + "\n")
    return 0

