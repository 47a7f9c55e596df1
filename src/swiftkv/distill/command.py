"""`swiftkv distill MODEL --data sharegpt --tokens 1M --out OUT` (also under `torchrun --nproc-per-node K`)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch


def register(subparsers) -> None:
    from ..cli.options import add_dataclass_options
    from .settings import DEFAULT_RECIPE, RECIPES, DistillSettings

    recipes = "; ".join(f"{name}: " + ", ".join(f"{k}={v}" for k, v in values.items())
                        for name, values in RECIPES.items())
    p = subparsers.add_parser(
        "distill", help="distill a converted SwiftKV model (teacher = the same weights with swiftkv off)",
        description="Train only the SwiftKV projections and norm_swiftkv so the student matches the teacher. "
        "Layers < N run once for both. Run under `torchrun --nproc-per-node K` for DDP. "
        f"Recipes (options given explicitly override them): {recipes}.")
    p.add_argument("model", help="SwiftKV HF folder (from `swiftkv convert`) or alias")
    p.add_argument("--recipe", default=DEFAULT_RECIPE, metavar="NAME",
                   help=f"named preset: {' or '.join(RECIPES)} (default {DEFAULT_RECIPE}; reference = ArcticTraining's "
                   "recipe; see docs/distillation.md)")
    add_dataclass_options(p, DistillSettings, defaults=RECIPES[DEFAULT_RECIPE])
    p.add_argument("--compare-naive", type=int, metavar="STEPS",
                   help="measure tokens/s of STEPS steps shared-prefix vs naive, print JSON, train nothing")
    p.add_argument("--speed", type=int, metavar="STEPS",
                   help="measure training tokens/s over STEPS steps (after a warm-up step), print JSON, train nothing")
    p.add_argument("--eval-only", action="store_true",
                   help="print the held-out KL / top-1 agreement of MODEL on the run's held-out split, train nothing")
    p.add_argument("--json", help="also write the run summary / comparison JSON here")
    p.set_defaults(func=run)


def settings_from_args(args):
    from ..cli.options import given_values
    from .settings import DistillSettings, settings_for

    return settings_for(args.model, args.recipe, **given_values(args, DistillSettings))


def run(args) -> int:
    from .setup import load_student, set_threads
    from .speed import measure_shared_vs_naive
    from .trainer import check_start, distill, finished, init_world, log, run_summary

    settings = settings_from_args(args)
    set_threads()
    if args.compare_naive:
        return report(measure_shared_vs_naive(settings, args.compare_naive), args.json)
    if args.speed:
        return report(measure_shared_vs_naive(settings, args.speed, naive=False), args.json)
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
    from ..files import atomic_output_dir
    from ..model.modeling import swiftkv_parameters
    from ..model.surgery import load_trained
    from ..sources import load_model

    # The source's own weights plus the trained tensors: the frozen ones were cast for compute.
    output = load_model(settings.source, dtype=torch.float32)
    load_trained(output, {name: p.detach().float() for name, p in swiftkv_parameters(model).items()})
    output.config.swiftkv = True
    with atomic_output_dir(settings.out, force=True) as tmp:
        output.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (Path(tmp) / "distill.json").write_text(json.dumps(summary, indent=2) + "\n")


def heldout_agreement(settings) -> dict:
    """Held-out KL / top-1 of the model as it is (the split depends on --data, --seed, --heldout-tokens)."""
    from ..data.packing import load_blocks
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

