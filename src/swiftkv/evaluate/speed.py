"""Scoring speed of the paired evaluation, measured in one run: the shared pass (layers < N once for
teacher and student) against two separate models, and against scoring the teacher alone.

    python -m swiftkv.evaluate.speed MODEL --teacher TEACHER [--items 40] [--repeats 2] [--out DIR]

The variants alternate (A B C A B C ...) so that load from other jobs hits them alike; each
repetition scores the same requests from an empty cache. Prints the ratios, writes speed.json/.png.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from ..files import write_atomic
from ..plots import figure
from .harness import load_task
from .loglikelihood import LoglikelihoodScorer
from .pair import STUDENT, TEACHER, load_pair
from .store import ResultStore

TASKS = ("arc_easy", "hellaswag", "mmlu")


def task_requests(name: str, items: int) -> list[tuple[str, str]]:
    """The (context, continuation) requests lm-eval builds for the first `items` items of a task."""
    tasks = list(load_task(name)["tasks"].values())
    per_task = max(1, items // len(tasks))
    requests = []
    for task in tasks[
        :items
    ]:  # a group (MMLU) with more subtasks than items: one item from each of the first
        task.build_all_requests(limit=per_task, rank=0, world_size=1)
        requests += [instance.args for instance in task.instances]
    return requests


def time_variant(pair, requests, roles) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        scorer = LoglikelihoodScorer(pair, ResultStore(Path(tmp) / "c.sqlite"), progress=False, roles=roles)
        started = time.perf_counter()
        for role in roles:
            scorer.loglikelihood(requests, role)
        return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m swiftkv.evaluate.speed", description=__doc__.split("\n")[0]
    )
    parser.add_argument("model")
    parser.add_argument("--teacher", required=True)
    parser.add_argument("--items", type=int, default=40, help="items per task (arc_easy, hellaswag, mmlu)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--tasks", default=",".join(TASKS), help="comma-separated tasks (default %(default)s)"
    )
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default="swiftkv-eval-speed")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    pairs = {
        "shared": load_pair(args.model, args.teacher),
        "separate": load_pair(args.model, args.teacher, share_early=False),
    }
    variants = {
        "teacher only": (pairs["separate"], (TEACHER,)),
        "paired, separate models": (pairs["separate"], (TEACHER, STUDENT)),
        "paired, shared pass": (pairs["shared"], (TEACHER, STUDENT)),
    }
    results = {}
    for task in args.tasks.split(","):
        requests = task_requests(task, args.items)
        times = {name: [] for name in variants}
        for _ in range(args.repeats):
            for name, (pair, roles) in variants.items():
                times[name].append(time_variant(pair, requests, roles))
        results[task] = {
            "requests": len(requests),
            **{name: statistics.median(t) for name, t in times.items()},
        }
        row = results[task]
        print(
            f"{task}: {len(requests)} requests; teacher only {row['teacher only']:.1f} s, paired separate "
            f"{row['paired, separate models']:.1f} s, paired shared {row['paired, shared pass']:.1f} s -> "
            f"shared/separate {row['paired, shared pass'] / row['paired, separate models']:.2f}, "
            f"shared/teacher-only {row['paired, shared pass'] / row['teacher only']:.2f}",
            flush=True,
        )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    payload = {
        "model": args.model,
        "teacher": args.teacher,
        "threads": args.threads,
        "repeats": args.repeats,
        "dtype": "bfloat16",
        "seconds_median": results,
    }
    write_atomic(out / "speed.json", json.dumps(payload, indent=2).encode())
    plot(results, out / "speed.png")
    print(f"wrote {out / 'speed.json'}, {out / 'speed.png'}")
    return 0


def plot(results: dict, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp.png")
    with figure(tmp, (7, 4)) as (_, ax):
        names = [k for k in next(iter(results.values())) if k != "requests"]
        width = 0.8 / len(names)
        for j, name in enumerate(names):
            ax.bar(
                [i + j * width for i in range(len(results))],
                [r[name] / r["requests"] * 1000 for r in results.values()],
                width,
                label=name,
            )
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(results))], list(results))
        ax.set_ylabel("ms per request (median)")
        ax.set_title("swiftkv eval scoring cost, measured in one run", fontsize=9)
        ax.legend(fontsize=8)
    tmp.replace(path)


if __name__ == "__main__":
    raise SystemExit(main())
