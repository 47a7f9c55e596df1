"""The sharded start of `--fsdp` (distill/start/sharded.py), proven by numbers with two gloo processes: each
process's shard of every parameter equals the matching rows of a whole one-process load, bit for bit
(dtype too), and so do the buffers; the first steps' losses and held-out scores equal those of the same
model loaded whole, then sharded; a teacher that differs only in rows another process reads is refused
on every process. The cases cover the families' layouts (tied and untied heads, biases, q/k norms, Mixtral's
renamed and fused experts), odd sizes that split unevenly, a bf16 folder, every trainable set and init that
computes values (copy, mean, adapters), and both compute dtypes."""

import json
import os
import subprocess
import sys

import pytest
import torch

from swiftkv.distill.core.trainable import install
from swiftkv.distill.core.trainer import cast_frozen
from swiftkv.distill.parallel.sharding import owned_rows
from swiftkv.distill.parallel.world import World
from swiftkv.distill.settings import DistillSettings
from swiftkv.distill.start.setup import load_student
from swiftkv.dtypes import resolve_dtype
from tests.tiny import random_chats, random_student, save_tiny_folder, tiny_tokenizer, write_jsonl

WORLD = 2
# Sizes that do not split evenly over two processes: the vocabulary, the MLP width, the adapters' rank.
ODD = {"vocab_size": 131, "intermediate_size": 99}
FOLDERS = {  # name: (arch, N, G, dtype stored, model options)
    "llama-odd": ("llama", 2, 2, torch.float32, {**ODD, "tie_word_embeddings": True}),
    "qwen3-untied": ("qwen3", 3, 3, torch.float32, {"tie_word_embeddings": False}),
    "qwen2-bf16": ("qwen2", 3, 1, torch.bfloat16, {"tie_word_embeddings": True}),
    "mixtral": ("mixtral", 3, 1, torch.float32, {"tie_word_embeddings": True}),
}
CASES = {  # name: (folder, settings, train both ways)
    "lora-mean-bf16": (
        "llama-odd",
        {"trainable": "lora", "lora_rank": 3, "init": "mean", "dtype": "bfloat16"},
        True,
    ),
    "swiftkv-copy-fp32": ("llama-odd", {"init": "copy", "dtype": "float32"}, True),
    "late-norms-copy": (
        "qwen3-untied",
        {"trainable": "late-norms", "init": "copy", "dtype": "float32"},
        False,
    ),
    "late-keep-bf16": ("qwen2-bf16", {"trainable": "late", "init": "keep", "dtype": "bfloat16"}, False),
    "experts-keep": ("mixtral", {"init": "keep", "dtype": "float32"}, False),
    "experts-mean-bf16": ("mixtral", {"init": "mean", "dtype": "bfloat16"}, False),
}
RUN = {
    "tokens": 512,
    "heldout_tokens": 64,
    "seq_len": 32,
    "batch_size": 4,
    "micro_batch": 1,
    "lr": 5e-3,
    "eval_every": 2,
    "targets": "human",
    "mse_weight": 0.0,
    "kl_mean_over": "targets",
    "fsdp": True,
}


def save_folders(root) -> dict:
    folders = {}
    for name, (arch, n, g, dtype, options) in FOLDERS.items():
        teacher, student = random_student(arch, n, g, swiftkv_std=0.2, max_position_embeddings=256, **options)
        folders[name] = save_tiny_folder(root / name, student.to(dtype), tiny_tokenizer())
        if name == "llama-odd":  # its teacher, and one that differs in a row only the last process reads
            folders["teacher"] = save_tiny_folder(root / "teacher", teacher, tiny_tokenizer())
            with torch.no_grad():
                teacher.model.layers[1].mlp.down_proj.weight[-1, 0] += 1.0
            folders["other-teacher"] = save_tiny_folder(root / "other-teacher", teacher, tiny_tokenizer())
    return folders


def case_settings(root, folders, name: str) -> dict:
    folder, options, _ = CASES[name]
    data = root / "chats.jsonl"
    return {
        **RUN,
        **options,
        "source": str(folders[folder]),
        "data": str(data),
        "out": str(root / f"out-{name}"),
    }


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """One torchrun launch for every case (a launch costs more than the cases)."""
    root = tmp_path_factory.mktemp("sharded")
    write_jsonl(root / "chats.jsonl", random_chats(60, seed=7))
    folders = save_folders(root)
    cases = [
        {"name": name, "settings": case_settings(root, folders, name), "train": train}
        for name, (_, _, train) in CASES.items()
    ]
    teacher = {**case_settings(root, folders, "swiftkv-copy-fp32"), "out": None}
    cases += [
        {"name": "same-teacher", "settings": {**teacher, "teacher": str(folders["teacher"])}},
        {"name": "other-teacher", "settings": {**teacher, "teacher": str(folders["other-teacher"])}},
    ]
    (root / "cases.json").write_text(json.dumps(cases))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={WORLD}"]
    command += ["-m", "tests.sharded_ranks", str(root / "cases.json"), str(root)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, env=torch_env())
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return root, {case["name"]: case["settings"] for case in cases}


def torch_env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


def saved(root, name: str, rank: int) -> dict:
    return torch.load(root / f"{name}-{rank}.pt", weights_only=False)


def whole_start(values: dict):
    """The run's model as one process starts it: loaded whole in fp32, the init and the trainable set
    applied, frozen weights in the compute dtype."""
    settings = DistillSettings.of(**values).opened()
    model, _ = load_student(settings)
    install(model, settings.model.trainable, settings.model.lora_rank, settings.optim.seed)
    cast_frozen(model, resolve_dtype(settings.parallel.dtype))
    return model


@pytest.mark.slow  # one torchrun launch of two processes for every test here
@pytest.mark.parametrize("name", list(CASES))
def test_each_process_holds_exactly_its_rows_of_a_whole_load(launched, name):
    root, settings = launched
    whole = whole_start(settings[name])
    parameters = dict(whole.named_parameters())
    for rank in range(WORLD):
        shards = saved(root, name, rank)
        for way in ("sharded", "whole"):  # the sharded start, and the whole model sharded after loading
            local = shards[way]["parameters"]
            assert local.keys() == parameters.keys()
            for key, parameter in parameters.items():
                start, stop = owned_rows(parameter.shape[0], World(rank=rank, size=WORLD))
                expected = parameter.detach()[start:stop]
                assert local[key].dtype == expected.dtype and torch.equal(local[key], expected), (
                    way,
                    rank,
                    key,
                )
            buffers = shards[way]["buffers"]
            assert all(torch.equal(buffers[key], b) for key, b in whole.named_buffers()), (way, rank)
    if CASES[name][0] == "llama-odd":
        assert any(p.shape[0] % WORLD for p in parameters.values())  # some shards are of unequal sizes


@pytest.mark.slow
@pytest.mark.parametrize("name", [name for name, (_, _, train) in CASES.items() if train])
def test_the_first_steps_equal_those_of_a_model_loaded_whole_then_sharded(launched, name):
    root, _ = launched
    for rank in range(WORLD):
        histories = saved(root, name, rank)["history"]
        losses = [entry["loss"] for entry in histories["sharded"] if "loss" in entry]
        assert len(losses) == 4 and histories["sharded"] == histories["whole"], histories


@pytest.mark.slow
def test_a_teacher_is_checked_by_rows_and_refused_on_every_process(launched):
    root, _ = launched
    for rank in range(WORLD):
        assert saved(root, "same-teacher", rank)["refused"] is None
        refused = saved(root, "other-teacher", rank)["refused"]
        assert "model.layers.1.mlp.down_proj.weight differs from the student's copy" in refused, refused
