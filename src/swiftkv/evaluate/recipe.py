"""`--tasks snowflake`: Snowflake's lm-eval recipe for its SwiftKV models, scored by lm-eval's own
transformers model (batched, on the device; under torchrun or accelerate launch lm-eval splits the items
over the processes itself).

Snowflake's published evaluation runs lm-eval task by task: truthfulqa_mc2 0-shot, winogrande 5-shot,
hellaswag 10-shot, and Meta's Llama-3.1-Instruct evaluations with the chat template: ARC-Challenge 0-shot,
GSM8K (chain of thought) 8-shot and MMLU 5-shot, the last two with the few-shot examples as turns of the
chat; answers of up to 1024 tokens in a 4096-token window. lm-eval names the Llama variants
arc_challenge_llama, gsm8k_llama and mmlu_llama (formerly *_llama_3.1_instruct). The data comes from the
Hugging Face hub: offline, every dataset must be in the local cache, checked before any model loads.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass

import torch

from ..dtypes import dtype_name
from ..model.config import is_swiftkv
from .processes import Processes

PRESET = "snowflake"
MAX_LENGTH = 4096
MAX_GEN_TOKENS = 1024
CPU_BATCH = 8  # lm-eval's "auto" batch size searches for the largest that fits a GPU's memory


@dataclass(frozen=True)
class RecipeTask:
    name: str  # lm-eval's task (or group) name
    shots: int
    metric: str  # the headline metric of the report (lm-eval's "metric,filter" key)
    datasets: tuple[tuple[str, str | None], ...]  # (hub path, config) the task reads
    chat: bool = False  # the prompt rendered with the model's chat template
    multiturn: bool = False  # the few-shot examples as earlier turns of the chat


MMLU_DATASET = "hails/mmlu_no_train"  # one config per subject; the first stands for all 57
RECIPE = (
    RecipeTask("truthfulqa_mc2", 0, "acc,none", (("truthfulqa/truthful_qa", "multiple_choice"),)),
    RecipeTask("winogrande", 5, "acc,none", (("allenai/winogrande", "winogrande_xl"),)),
    RecipeTask("hellaswag", 10, "acc_norm,none", (("Rowan/hellaswag", None),)),
    RecipeTask(
        "arc_challenge_llama",
        0,
        "exact_match,strict_match",
        (("allenai/ai2_arc", "ARC-Challenge"),),
        chat=True,
    ),
    RecipeTask(
        "gsm8k_llama", 8, "exact_match,strict_match", (("openai/gsm8k", "main"),), chat=True, multiturn=True
    ),
    RecipeTask(
        "mmlu_llama",
        5,
        "exact_match,strict_match",
        ((MMLU_DATASET, "abstract_algebra"),),
        chat=True,
        multiturn=True,
    ),
)


def hub_offline() -> bool:
    import datasets
    import huggingface_hub.constants

    return bool(huggingface_hub.constants.HF_HUB_OFFLINE or datasets.config.HF_DATASETS_OFFLINE)


def missing_datasets() -> list[str]:
    """The recipe's datasets that cannot be read offline (none while the hub is reachable: lm-eval
    downloads them)."""
    import datasets

    if not hub_offline():
        return []
    missing = []
    for task in RECIPE:
        for path, config in task.datasets:
            try:
                datasets.load_dataset_builder(path, config)
            except Exception:  # datasets raises several types for "not in the cache"
                missing.append(f"{path}" + (f" ({config})" if config else "") + f" for {task.name}")
    return missing


def check_recipe_data() -> None:
    """One error naming every dataset the recipe needs and cannot read, before any model loads."""
    missing = missing_datasets()
    if missing:
        raise ValueError(
            f"--tasks {PRESET} needs Hugging Face hub datasets that are not in the local cache while "
            f"HF_HUB_OFFLINE / HF_DATASETS_OFFLINE is set: {'; '.join(missing)}. Run once where the hub is "
            "reachable (unset HF_HUB_OFFLINE), or choose shipped tasks with --tasks"
        )


def score_model(
    folder: str,
    swiftkv: bool | None,
    dtype: torch.dtype,
    processes: Processes,
    limits: dict,
    tasks: tuple[RecipeTask, ...] = RECIPE,
    task_manager=None,
) -> dict:
    """Each of `tasks` for one model (lm-eval's default task registry unless `task_manager`); lm-eval's
    metrics per task, in process 0 (the others get {}: lm-eval gathers the results there)."""
    import lm_eval
    from lm_eval.models.huggingface import HFLM

    lm = HFLM(
        pretrained=folder,
        dtype=dtype_name(dtype),
        device=str(processes.device),
        batch_size="auto" if processes.device.type == "cuda" else CPU_BATCH,  # auto probes memory
        max_length=MAX_LENGTH,
    )
    if is_swiftkv(lm.model.config) and swiftkv is not None:
        lm.model.set_swiftkv(swiftkv)  # the student's path, or its own teacher's
    scores = {}
    for task in tasks:
        run = lm_eval.simple_evaluate(
            model=lm,
            tasks=[task.name],
            num_fewshot=task.shots,
            apply_chat_template=task.chat,
            fewshot_as_multiturn=task.multiturn,
            gen_kwargs={"max_gen_toks": MAX_GEN_TOKENS},
            limit=limits.get(task.name),
            task_manager=task_manager,
            verbosity="ERROR",
        )
        if run is not None:  # lm-eval returns the gathered results in process 0 only
            scores[task.name] = numbers(run["results"][task.name])
    del lm
    gc.collect()
    if processes.device.type == "cuda":
        torch.cuda.empty_cache()
    return scores


def numbers(result: dict) -> dict[str, float]:
    return {key: value for key, value in result.items() if isinstance(value, float)}


def recipe_tasks() -> dict[str, RecipeTask]:
    return {task.name: task for task in RECIPE}


def evaluate_recipe(students: list, teacher, dtype: torch.dtype, processes: Processes, limits: dict) -> dict:
    """The recipe for the teacher (TEACHER, or the student's own teacher path) and each student: the
    task settings, and per model lm-eval's metrics (filled in process 0)."""
    models = {}
    if teacher is not None:
        models[str(teacher)] = score_model(str(teacher.folder), None, dtype, processes, limits)
    else:
        models[f"{students[0]} (swiftkv off)"] = score_model(
            str(students[0].folder), False, dtype, processes, limits
        )
    for student in students:
        models[str(student)] = score_model(str(student.folder), True, dtype, processes, limits)
    return {
        "name": PRESET,
        "engine": f"lm-eval's transformers model (HFLM; {processes.device.type}, {dtype_name(dtype)}, "
        f"{processes.size} process(es))",
        "tasks": {
            task.name: {
                "shots": task.shots,
                "chat": task.chat,
                "multiturn": task.multiturn,
                "metric": task.metric,
            }
            for task in RECIPE
        },
        "models": models,
    }
