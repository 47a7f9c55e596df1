"""One evaluation run: each student against the teacher, on lm-eval tasks and held-out chat."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from ..data.chat import first_user_prompt
from ..data.heldout import heldout_conversations
from ..data.tokens import prompt_ids
from ..dtypes import dtype_name, resolve_dtype
from ..flops import prefill_compute_saving
from ..model.config import is_swiftkv
from ..results import EvalResults, LongQA, TaskResult
from ..sources import Source, check_supported, open_source
from .chat import GENERATION_BATCH, generation_agreement, teacher_forced_agreement
from .harness import run_task
from .instructions import check_instruction_context, instruction_following
from .loglikelihood import LoglikelihoodScorer
from .long_prompt import check_long_context, heldout_long_prompts, long_prompt_agreement
from .long_qa import check_qa_context, long_qa_agreement
from .pair import describe, load_floor_pair, load_pair, recorded_name
from .processes import Processes, SharedStore, eval_device
from .recipe import check_recipe_data, evaluate_recipe
from .settings import EvalSettings
from .store import ResultStore


def evaluate_student(
    student: Source, teacher: Source | None, settings: EvalSettings, store, processes: Processes
) -> dict:
    started = time.time()
    pair = load_pair(student, teacher, resolve_dtype(settings.dtype, processes.device), processes=processes)
    if settings.long_prompts:
        check_long_context(pair.max_length, settings.gen_tokens)
    check_qa_context(pair.tokenizer, settings.long_qa_sets, pair.max_length, settings.long_qa_tokens)
    if settings.instructions:
        check_instruction_context(
            pair.tokenizer, settings.instructions, pair.max_length, settings.instruction_tokens
        )
    scorer = LoglikelihoodScorer(pair, store, settings.batch_tokens, settings.progress)
    tasks = {}
    for name in settings.tasks:
        tasks[name] = run_task(name, scorer, settings.limits.get(name))
        if processes.is_main:
            print_task_line(student, name, tasks[name])
    result = {"pair": describe(pair), "tasks": tasks, **agreement(pair, settings, store)}
    for name, qa in result.get("long_qa", {}).items():
        if processes.is_main:
            print_long_qa_line(student, name, qa)
    result["prefill_compute_saving"] = prefill_compute_saving(pair.student.config)
    result["seconds"] = time.time() - started
    return result


def agreement(pair, settings: EvalSettings, store: ResultStore) -> dict:
    """The agreement measures of a pair: held-out chat (teacher-forced, greedy) and long prompts."""
    result = {}
    if settings.chat_conversations:
        conversations = heldout_conversations()[: settings.chat_conversations]
        result["teacher_forced"] = teacher_forced_agreement(
            pair, store, conversations, settings.chat_max_tokens, settings.progress
        )
    if settings.gen_prompts:
        result["generation"] = generation_agreement(
            pair,
            store,
            generation_prompts(pair.tokenizer, settings),
            settings.gen_tokens,
            progress=settings.progress,
        )
    if settings.long_prompts:
        prompts = heldout_long_prompts(pair.tokenizer, settings.long_prompts)
        result["long_prompt"] = long_prompt_agreement(
            pair, store, prompts, settings.gen_tokens, settings.progress
        )
    if settings.long_qa_sets:
        result["long_qa"] = {
            name: long_qa_agreement(pair, store, name, items, settings.long_qa_tokens, settings.progress)
            for name, items in settings.long_qa_sets.items()
        }
    if settings.instructions:
        result["instruction_following"] = instruction_following(
            pair, store, settings.instructions, settings.instruction_tokens, settings.progress
        )
    return result


def floor_dtype(settings: EvalSettings, dtype: torch.dtype) -> torch.dtype:
    if settings.floor_dtype != "other":
        return getattr(torch, settings.floor_dtype)
    return torch.bfloat16 if dtype == torch.float32 else torch.float32


def evaluate_floor(teacher: Source, settings: EvalSettings, store, processes: Processes) -> dict:
    """The teacher against itself at another dtype, on the agreement measures only."""
    started = time.time()
    dtype = resolve_dtype(settings.dtype, processes.device)
    pair = load_floor_pair(teacher, dtype, floor_dtype(settings, dtype), processes)
    return {"pair": describe(pair), **agreement(pair, settings, store), "seconds": time.time() - started}


def check_floor(students: list[Source], teacher: Source | None) -> None:
    """--floor compares a teacher with itself, for SwiftKV students: refused before any model loads."""
    if teacher is None:
        raise ValueError("--floor scores the teacher against itself at another dtype; pass --teacher")
    for student in students:
        if not is_swiftkv(check_supported(student.folder)):
            raise ValueError(
                f"--floor: {student.name!r} is not a SwiftKV model (no num_key_value_layers); the floor "
                "bounds how closely a SwiftKV student can follow its teacher"
            )


def generation_prompts(tokenizer, settings: EvalSettings) -> list[list[dict]]:
    """First user turns of the held-out conversations whose rendered prompt is short enough."""
    prompts = []
    for messages in heldout_conversations():
        prompt = first_user_prompt(messages)
        if prompt is None:
            continue
        if len(prompt_ids(tokenizer, prompt)) <= settings.gen_max_prompt_tokens:
            prompts.append(prompt)
        if len(prompts) == settings.gen_prompts:
            break
    return prompts


def print_task_line(student: str, task: str, result: dict) -> None:
    result = TaskResult.from_json(result)
    paired = result.paired["acc"]
    print(
        f"[{student}] {task}: {result.items} items, acc teacher {paired.teacher:.4f} student "
        f"{paired.student:.4f} ({paired.diff:+.4f} ± {paired.diff_stderr:.4f}), "
        f"agreement {paired.agreement:.3f}",
        flush=True,
    )


def print_long_qa_line(student: str, name: str, result: dict) -> None:
    result = LongQA.from_json(result)
    correct = result.paired["correct"]
    print(
        f"[{student}] long-QA {name}: {result.items} items, correct teacher {correct.teacher:.3f} student "
        f"{correct.student:.3f} ({correct.diff:+.3f} ± {correct.diff_stderr:.3f}, p={correct.mcnemar_p:.2g}), "
        f"same verdict {correct.agreement:.3f}, identical {result.identical_fraction:.3f}",
        flush=True,
    )


def open_store(settings: EvalSettings, processes: Processes):
    """The results cache; with several processes, the first one's, shared with the others."""
    if processes.size == 1:
        return ResultStore(Path(settings.cache) if settings.cache else None)
    own = ResultStore(Path(settings.cache) if settings.cache else None) if processes.is_main else None
    return SharedStore(own, processes)


def engines(processes: Processes, dtype: torch.dtype) -> dict[str, str]:
    """What computed each measure, for the report."""
    where = f"{processes.device.type}, {dtype_name(dtype)}"
    return {
        "log-likelihoods and teacher-forced agreement": f"transformers ({where}, batched forwards)",
        "greedy generation": f"transformers ({where}, batches of up to {GENERATION_BATCH} left-padded prompts)",
    }


def open_models(settings: EvalSettings) -> tuple[list[Source], Source | None]:
    """The students and the teacher, opened (a shipped alias or a GGUF is built into the cache here).
    Under torchrun this must come before the process group starts: once it has, transformers'
    save_pretrained writes on global rank 0 only, so another process could not build its copy."""
    if settings.recipe:
        check_recipe_data()  # before any model is built
    students = [open_source(student, settings.revision) for student in settings.students]
    teacher = None if settings.teacher is None else open_source(settings.teacher, settings.teacher_revision)
    return students, teacher


def evaluate_models(
    settings: EvalSettings,
    processes: Processes | None = None,
    models: tuple[list[Source], Source | None] | None = None,
) -> EvalResults:
    """Each of `settings.students` scored against `settings.teacher` (`write_report` writes the results
    into `settings.out`). `models`: what `open_models` returned (opened here when not given). With several
    `processes` (torchrun), each computes its share and every process returns the same results."""
    started = time.time()
    processes = processes or Processes(device=eval_device(settings.device))
    dtype = resolve_dtype(settings.dtype, processes.device)
    students, teacher = models or open_models(settings)
    if settings.floor:
        check_floor(students, teacher)
    store = open_store(settings, processes)
    try:
        results = [evaluate_student(student, teacher, settings, store, processes) for student in students]
        floor = evaluate_floor(teacher, settings, store, processes) if settings.floor else None
    finally:
        store.close()
    recipe = None
    if settings.recipe:
        recipe = evaluate_recipe(students, teacher, dtype, processes, settings.limits)
    return EvalResults.from_json(
        {
            "teacher": recorded_name(teacher) if teacher else f"{recorded_name(students[0])} (swiftkv off)",
            "dtype": dtype_name(dtype),
            "engines": engines(processes, dtype),
            "tasks": list(settings.tasks),
            "limits": settings.limits,
            "settings": {
                "batch_tokens": settings.batch_tokens,
                "chat_conversations": settings.chat_conversations,
                "chat_max_tokens": settings.chat_max_tokens,
                "gen_prompts": settings.gen_prompts,
                "gen_tokens": settings.gen_tokens,
                "long_prompts": settings.long_prompts,
                "long_qa": settings.long_qa,
                "long_qa_items": settings.long_qa_items,
                "long_qa_tokens": settings.long_qa_tokens,
                "long_prompt_formats": settings.long_prompt_formats,
                "long_prompt_format_tokens": settings.long_prompt_format_tokens,
                "long_prompt_format_items": settings.long_prompt_format_items,
                "instruction_following": settings.instruction_following,
                "instruction_items": settings.instruction_items,
                "instruction_tokens": settings.instruction_tokens,
                "threads": torch.get_num_threads(),
                "processes": processes.size,
                **settings.extra,
            },
            "students": results,
            "floor": floor,
            "recipe": recipe,
            "wall_time_s": time.time() - started,
        }
    )
