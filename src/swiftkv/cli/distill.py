"""`swiftkv distill MODEL --out OUT` (also under `torchrun --nproc-per-node K -m swiftkv.cli distill ...`)."""

from __future__ import annotations

import argparse
import json
import sys

import torch.distributed as dist

from ..distill import (
    RECIPES,
    SECTIONS,
    TIMED_STEPS,
    DistillSettings,
    PlanRequest,
    bound_line,
    default_recipe,
    heldout_agreement,
    launched_as_main,
    measure_shared_vs_naive,
    model_parameters,
    print_plan,
    run_distillation,
    set_threads,
    settings_for,
    with_folder_rank,
)
from ..files import write_atomic
from .options import add_dataclass_options, given_values


def register(subparsers) -> None:
    recipes = "; ".join(
        f"{name}: " + (", ".join(f"{k}={v}" for k, v in values.items()) or "the defaults shown")
        for name, values in RECIPES.items()
    )
    parser = subparsers.add_parser(
        "distill",
        help="distill a converted SwiftKV model (teacher = the same weights with swiftkv off)",
        description="Train only the SwiftKV projections and norm_swiftkv so the student matches the teacher. "
        "Layers < N run once for both. Run under `torchrun --nproc-per-node K` for DDP. "
        f"Recipes (options given explicitly override them): {recipes}.",
    )
    parser.add_argument("model", help="SwiftKV HF folder (from `swiftkv convert`) or alias")
    parser.add_argument(
        "--recipe",
        metavar="NAME",
        help=f"named preset: {' or '.join(RECIPES)} (default: by the model's size, reference-large from "
        "1B parameters, else swiftkv; reference = ArcticTraining's recipe; see docs/distillation.md)",
    )
    for name, section in SECTIONS.items():  # one group per section of the settings, in --help too
        add_dataclass_options(parser.add_argument_group(f"{name} settings"), section)
    add_mode_options(parser)
    add_plan_options(parser)
    parser.add_argument("--json", help="also write the run summary / measurement JSON here")
    parser.set_defaults(func=run)


# What `distill` does with the run its options describe: train it, or measure it and train nothing.
MODES = {
    "train": "train and write --out (the default)",
    "plan": "the memory per process of this run (weights, trained parameters, gradients, optimizer state, "
    "activations) for DDP and FSDP at --world-size processes, whether it fits (--device-memory) and what would, "
    "and its time on this machine's device (tok/s, device-hours per 100M tokens, from --timed-steps steps on "
    "random weights of MODEL's shape); MODEL may be a folder holding only a config.json, a SwiftKV one or a "
    "plain HF one (see --num-key-value-layers)",
    "speed": "training tokens/s over --timed-steps steps (after a warm-up step), as JSON",
    "compare-naive": "tokens/s of --timed-steps steps, shared prefix vs naive, as JSON",
    "eval-only": "the held-out KL / top-1 agreement of MODEL on the run's held-out split",
}
# The flags each mode once had, still read (a model card's commands name them) and kept out of --help.
MODE_FLAGS = {
    "--plan": "plan",
    "--eval-only": "eval-only",
    "--speed": "speed",
    "--compare-naive": "compare-naive",
}


class ModeAction(argparse.Action):
    """--mode, or a mode's own flag: one mode per command, a second one refused by name."""

    def __call__(self, parser, namespace, values, option_string=None):
        mode = values if option_string == "--mode" else MODE_FLAGS[option_string]
        given = getattr(namespace, "mode_flag", None)
        if given is not None and namespace.mode != mode:
            parser.error(
                f"{given} and {option_string} ask for two modes; give one --mode ({', '.join(MODES)})"
            )
        namespace.mode, namespace.mode_flag = mode, option_string
        if option_string in ("--speed", "--compare-naive"):
            namespace.timed_steps = values


def add_mode_options(parser) -> None:
    parser.add_argument(
        "--mode",
        action=ModeAction,
        choices=tuple(MODES),
        default="train",
        help="; ".join(f"{name}: {what}" for name, what in MODES.items())
        + ". Every mode but train trains nothing",
    )
    parser.add_argument(
        "--timed-steps",
        "--plan-steps",
        dest="timed_steps",
        type=int,
        default=TIMED_STEPS,
        metavar="STEPS",
        help="--mode speed / compare-naive: the steps timed; --mode plan: timed steps on random weights on this "
        f"machine's device, 0: no time (default {TIMED_STEPS})",
    )
    for flag in ("--plan", "--eval-only"):
        parser.add_argument(flag, action=ModeAction, nargs=0, help=argparse.SUPPRESS)
    for flag in ("--speed", "--compare-naive"):
        parser.add_argument(flag, action=ModeAction, type=int, metavar="STEPS", help=argparse.SUPPRESS)


def add_plan_options(parser) -> None:
    parser.add_argument("--world-size", type=int, default=1, metavar="K", help="processes the plan is for")
    parser.add_argument(
        "--plan-device",
        choices=("cuda", "cpu"),
        default="cuda",
        help="the device the plan is for (a CPU keeps attention probabilities; default cuda)",
    )
    parser.add_argument(
        "--num-key-value-layers",
        type=int,
        metavar="N",
        help="the plan of a plain HF config (not converted yet): the N it would be converted at (default L/2)",
    )
    parser.add_argument(
        "--key-value-group-size",
        type=int,
        metavar="G",
        help="the plan of a plain HF config: its G (default 1)",
    )
    parser.add_argument(
        "--device-memory",
        type=float,
        metavar="GIB",
        help="the plan's memory per process to fit (default: this GPU's, or on --plan-device cpu the RAM's share)",
    )


def run(args) -> int:
    given = {
        key: value for section in SECTIONS.values() for key, value in given_values(args, section).items()
    }
    recipe = chosen_recipe(args)
    settings = with_folder_rank(settings_for(args.model, recipe, **given), "lora_rank" in given)
    if args.mode == "plan":
        return plan(settings, args)
    if args.num_key_value_layers or args.key_value_group_size or args.device_memory:
        raise ValueError(
            "--num-key-value-layers, --key-value-group-size and --device-memory describe a plan "
            "(--mode plan); a run trains the converted folder as it is"
        )
    set_threads()
    if settings.parallel.fsdp and args.mode != "train":
        raise ValueError(
            f"--fsdp applies to a training run; --mode {args.mode} runs one process on the whole model: "
            "drop --fsdp"
        )
    return {"train": train, "speed": speed, "compare-naive": speed, "eval-only": eval_only}[args.mode](
        settings, args
    )


def plan(settings: DistillSettings, args) -> int:
    request = PlanRequest(
        args.world_size,
        args.plan_device,
        args.num_key_value_layers,
        args.key_value_group_size,
        args.device_memory,
        args.timed_steps,
    )
    print_plan(settings, request, args.json)
    return 0


def speed(settings: DistillSettings, args) -> int:
    measured = measure_shared_vs_naive(settings, args.timed_steps, naive=args.mode == "compare-naive")
    report(measured, args.json)
    print(f"swiftkv distill: {bound_line(measured['compute_bound'])}", file=sys.stderr, flush=True)
    return 0


def eval_only(settings: DistillSettings, args) -> int:
    return report(heldout_agreement(settings), args.json)


def train(settings: DistillSettings, args) -> int:
    result = run_distillation(settings)
    if is_main_process():
        print(json.dumps({k: v for k, v in result.summary.items() if k != "history"}), flush=True)
        if args.json:
            write_json(args.json, result.summary)
    return 0


def chosen_recipe(args) -> str:
    """--recipe, or the recipe for the model's size; the run's first line says which and why."""
    if args.recipe is not None:
        return args.recipe
    recipe, why = default_recipe(model_parameters(args.model))
    if launched_as_main():
        print(
            f"swiftkv distill: recipe {recipe} ({why}; --recipe NAME picks another)",
            file=sys.stderr,
            flush=True,
        )
    return recipe


def is_main_process() -> bool:
    return not dist.is_initialized() or dist.get_rank() == 0


def write_json(path: str, payload: dict) -> None:
    write_atomic(path, json.dumps(payload, indent=2) + "\n")


def report(result: dict, json_path: str | None) -> int:
    print(json.dumps(result, indent=2))
    if json_path:
        write_json(json_path, result)
    return 0
