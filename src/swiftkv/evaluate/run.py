"""One evaluation run: each student against the teacher, on lm-eval tasks and held-out chat."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from ..data.chat import first_user_prompt
from ..data.heldout import heldout_conversations
from ..dtypes import dtype_name, resolve_dtype
from ..metrics import prefill_compute_saving
from .chat import generation_agreement, generation_prompt_ids, teacher_forced_agreement
from .harness import run_task
from .loglikelihood import LoglikelihoodScorer
from .pair import describe, load_pair
from .settings import EvalSettings
from .store import ResultStore


def evaluate_student(student: str, teacher: str | None, settings: EvalSettings, store: ResultStore) -> dict:
    started = time.time()
    pair = load_pair(student, teacher, resolve_dtype(settings.dtype))
    scorer = LoglikelihoodScorer(pair, store, settings.batch_tokens, settings.progress)
    tasks = {}
    for name in settings.tasks:
        tasks[name] = run_task(name, scorer, settings.limits.get(name))
        print_task_line(student, name, tasks[name])
    result = {"pair": describe(pair), "tasks": tasks}
    if settings.chat_conversations:
        conversations = heldout_conversations()[:settings.chat_conversations]
        result["teacher_forced"] = teacher_forced_agreement(pair, store, conversations, settings.chat_max_tokens,
                                                            settings.progress)
    if settings.gen_prompts:
        result["generation"] = generation_agreement(pair, store, generation_prompts(pair.tokenizer, settings),
                                                    settings.gen_tokens, progress=settings.progress)
    result["prefill_compute_saving"] = prefill_compute_saving(pair.student.config)
    result["seconds"] = time.time() - started
    return result


def generation_prompts(tokenizer, settings: EvalSettings) -> list[list[dict]]:
    """First user turns of the held-out conversations whose rendered prompt is short enough."""
    prompts = []
    for messages in heldout_conversations():
        prompt = first_user_prompt(messages)
        if prompt is None:
            continue
        if len(generation_prompt_ids(tokenizer, prompt)) <= settings.gen_max_prompt_tokens:
            prompts.append(prompt)
        if len(prompts) == settings.gen_prompts:
            break
    return prompts


def print_task_line(student: str, task: str, result: dict) -> None:
    paired = result["paired"]["acc"]
    print(f"[{student}] {task}: {result['items']} items, acc teacher {paired['teacher']:.4f} student "
          f"{paired['student']:.4f} ({paired['diff']:+.4f} ± {paired['diff_stderr']:.4f}), "
          f"agreement {paired['agreement']:.3f}", flush=True)


def evaluate_models(students: list[str], teacher: str | None, settings: EvalSettings,
                    cache: Path | None = None) -> dict:
    started = time.time()
    store = ResultStore(cache)
    try:
        results = [evaluate_student(student, teacher, settings, store) for student in students]
    finally:
        store.close()
    return {
        "teacher": teacher or f"{students[0]} (swiftkv off)",
        "dtype": dtype_name(resolve_dtype(settings.dtype)),
        "tasks": list(settings.tasks),
        "limits": settings.limits,
        "settings": {"batch_tokens": settings.batch_tokens, "chat_conversations": settings.chat_conversations,
                     "chat_max_tokens": settings.chat_max_tokens, "gen_prompts": settings.gen_prompts,
                     "gen_tokens": settings.gen_tokens, "threads": torch.get_num_threads(), **settings.extra},
        "students": results,
        "wall_time_s": time.time() - started,
    }
