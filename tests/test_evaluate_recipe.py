"""`--tasks snowflake`: the recipe names tasks, shots and data as the installed lm-eval defines them, and
offline without the hub's datasets it is one error naming each of them, before any model loads."""

import pytest
import torch

from swiftkv.cli import main
from swiftkv.evaluate.recipe import RECIPE, recipe_tasks
from swiftkv.evaluate.report import recipe_table


@pytest.mark.slow  # indexes all of lm-eval's task YAMLs (about 20 s)
def test_the_recipe_matches_lm_evals_registry():
    from lm_eval.tasks import TaskManager

    index = TaskManager().task_index
    for task in RECIPE:
        assert task.name in index, task.name
        if task.name == "mmlu_llama":  # a group of 57 subjects, each 5-shot with the chat template
            assert index[task.name].kind.name == "GROUP"
            config = index["mmlu_llama_abstract_algebra"].cfg
        else:
            config = index[task.name].cfg
        assert (config["dataset_path"], config.get("dataset_name")) == task.datasets[0], task.name
        assert config.get("num_fewshot") in (None, task.shots), task.name  # None: the shots are ours


def test_offline_without_the_datasets_is_one_error_before_any_model_loads(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("datasets.config.HF_DATASETS_OFFLINE", True)
    not_a_model = tmp_path / "empty"  # loading it would fail with another error
    not_a_model.mkdir()
    code = main(
        ["eval", str(not_a_model), "--tasks", "snowflake", "--device", "cpu", "--out", str(tmp_path / "o")]
    )
    assert code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and "--tasks snowflake needs Hugging Face hub datasets" in errors[0]
    for task in RECIPE:
        assert task.datasets[0][0] in errors[0] and task.name in errors[0]
    assert "HF_HUB_OFFLINE" in errors[0]


def test_the_recipe_table_shows_each_models_headline_metric():
    recipe = {
        "name": "snowflake",
        "engine": "lm-eval's transformers model",
        "tasks": {
            name: {"shots": t.shots, "chat": t.chat, "multiturn": t.multiturn, "metric": t.metric}
            for name, t in recipe_tasks().items()
        },
        "models": {"teacher": {"hellaswag": {"acc_norm,none": 0.5, "acc,none": 0.4}}, "student": {}},
    }
    lines = recipe_table(recipe)
    assert "| teacher | - | - | 0.5000 | - | - | - |" in lines
    assert "| student | - | - | - | - | - | - |" in lines
    assert any("hellaswag (10-shot)" in line and "gsm8k_llama (8-shot, chat)" in line for line in lines)


@pytest.mark.slow  # lm-eval's HFLM on real (shipped, offline) task data
def test_a_recipe_task_is_scored_by_lm_evals_model_on_either_path(tmp_path):
    from swiftkv.evaluate.harness import task_manager
    from swiftkv.evaluate.processes import Processes
    from swiftkv.evaluate.recipe import RecipeTask, score_model
    from tests.test_evaluate import save_models
    from tests.tiny import byte_tokenizer

    folder = str(save_models(tmp_path, byte_tokenizer())["student"])
    task = RecipeTask(
        "arc_easy", 2, "acc,none", (), chat=True, multiturn=True
    )  # shipped data, Snowflake's way
    scores = {
        path: score_model(folder, path, torch.float32, Processes(), {"arc_easy": 6}, (task,), task_manager())
        for path in (False, True)
    }
    for score in scores.values():
        assert 0 <= score["arc_easy"]["acc,none"] <= 1 and "acc_norm,none" in score["arc_easy"]
