"""What each process of a sharded run starts from, both ways, for tests/test_sharded_start.py, which runs
this under torchrun (gloo): `python -m tests.sharded_ranks CASES.json OUT`.

For each case of CASES.json (a name and DistillSettings values), every process starts the run's model
the sharded way (`load_student` under --fsdp: built on the meta device, each shard filled from the
files) and the way a model in memory is started (loaded whole, then sharded), and saves the local shards
and buffers of each to OUT/<name>-<rank>.pt. A case with "train": true also trains both ways
(`run_distillation`; the library's `distill` of the whole model) and saves both histories. A case with
a teacher only starts the sharded way and saves why the teacher was refused (None: it was not).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from swiftkv.distill.core.trainer import prepare, training_blocks
from swiftkv.distill.parallel.world import World, init_world
from swiftkv.distill.run import distill, run_distillation
from swiftkv.distill.settings import DistillSettings
from swiftkv.distill.start.setup import load_student


def started(settings: DistillSettings, world: World, sharded: bool) -> dict:
    """This process's shards (and buffers) of the run's model as `trainer.prepare` leaves it."""
    model, tokenizer = load_student(settings, world if sharded else World())
    train, _ = training_blocks(settings, tokenizer)
    prepare(settings, model, train, world)
    return {
        "parameters": {name: p.to_local().detach().clone() for name, p in model.named_parameters()},
        "buffers": {name: b.detach().clone() for name, b in model.named_buffers()},
    }


def trained_histories(settings: DistillSettings, world: World) -> dict:
    sharded = run_distillation(settings).summary["history"]
    model, tokenizer = load_student(settings)
    whole = distill(settings.but(out=None), model, tokenizer, world).history
    return {"sharded": sharded, "whole": whole}


def refusal(settings: DistillSettings, world: World) -> str | None:
    try:
        load_student(settings, world)
    except ValueError as error:
        return str(error)
    return None


def main(cases: str, out: str) -> None:
    world = init_world(fsdp=True)
    for case in json.loads(Path(cases).read_text()):
        settings = DistillSettings.of(**case["settings"]).opened()
        if settings.model.teacher is not None:
            torch.save({"refused": refusal(settings, world)}, Path(out) / f"{case['name']}-{world.rank}.pt")
            continue
        result = {way: started(settings, world, way == "sharded") for way in ("sharded", "whole")}
        if case.get("train"):
            result["history"] = trained_histories(settings, world)
        torch.save(result, Path(out) / f"{case['name']}-{world.rank}.pt")


if __name__ == "__main__":
    main(*sys.argv[1:])
