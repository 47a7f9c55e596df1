"""Models named by Hub repo id: every stage that takes a model finds it in the Hugging Face cache (laid out
here as `huggingface_hub` writes it: models--ORG--NAME/snapshots/COMMIT/ and refs/BRANCH), at --revision,
with HF_HUB_OFFLINE=1 (the tests' setting); an id not cached is one error naming it, before any work."""

import json
import os
import shutil
from pathlib import Path
from unittest.mock import patch

import pytest
from huggingface_hub import constants
from safetensors.torch import load_file

from swiftkv import hub
from swiftkv.cli import main
from swiftkv.replies import read_replies
from swiftkv.sources import open_source
from tests.tiny import random_chats, random_student, save_tiny_folder, tiny_tokenizer, write_jsonl

TEACHER, STUDENT = "tiny-org/teacher", "tiny-org/student"
MISSING = "nobody/not-cached"
# The same tiny pair as `tiny.tiny_student` (SwiftKV N=3 of 6 over `tiny_tokenizer()`).
SHAPE = dict(swiftkv_std=0.2, max_position_embeddings=256, tie_word_embeddings=True)


def cache_repo(
    cache: Path, repo_id: str, folder: Path, commit: str, refs: tuple[str, ...] = ("main",)
) -> Path:
    """`folder`'s files as the snapshot `commit` of `repo_id` in the HF cache `cache`, named by `refs`."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    shutil.copytree(folder, snapshot)
    (repo / "refs").mkdir(exist_ok=True)
    for ref in refs:
        (repo / "refs" / ref).write_text(commit)
    return snapshot


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory):
    """An HF cache holding TEACHER (main: seed 0; branch `other`: another teacher, seed 1) and STUDENT (the
    seed-0 teacher converted), and the local folders they were made from."""
    root = tmp_path_factory.mktemp("hub")
    cache = root / "cache"
    teacher, student = random_student("llama", 3, seed=0, **SHAPE)
    other, _ = random_student("llama", 3, seed=1, **SHAPE)
    folders = {
        name: save_tiny_folder(root / name, model, tiny_tokenizer())
        for name, model in (("teacher", teacher), ("other", other), ("student", student))
    }
    snapshots = {
        "teacher": cache_repo(cache, TEACHER, folders["teacher"], "a" * 40),
        "other": cache_repo(cache, TEACHER, folders["other"], "b" * 40, refs=("other",)),
        "student": cache_repo(cache, STUDENT, folders["student"], "c" * 40),
    }
    return {"cache": cache, "folders": folders, "snapshots": snapshots, "root": root}


@pytest.fixture
def cache(hub_cache, monkeypatch):
    """The tests' HF cache in place of the user's (`huggingface_hub` reads HF_HUB_CACHE once, at import)."""
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub_cache["cache"]))
    monkeypatch.setenv("HF_HUB_CACHE", str(hub_cache["cache"]))
    assert constants.HF_HUB_OFFLINE  # conftest: every test runs offline
    return hub_cache


def one_error(capsys, command: str) -> str:
    err = [line for line in capsys.readouterr().err.splitlines() if "error" in line.lower()]
    assert len(err) == 1 and err[0].startswith(f"swiftkv {command}: error: "), err
    return err[0]


def test_repo_ids_are_org_slash_name_and_nothing_here(tmp_path, monkeypatch):
    assert hub.is_repo_id("meta-llama/Llama-3.1-8B-Instruct") and hub.is_repo_id("Qwen/Qwen3-0.6B")
    for text in (
        "smollm2-135m-instruct",
        "a/b/c",
        "/abs/path",
        "./org/name",
        "org/model.gguf",
        "org/config.json",
    ):
        assert not hub.is_repo_id(text), text
    monkeypatch.chdir(tmp_path)
    (tmp_path / "out" / "skv50").mkdir(parents=True)
    assert not hub.is_repo_id("out/skv50")  # a folder that exists here is a folder


def test_an_id_resolves_to_its_cached_snapshot_at_its_revision(cache):
    snapshots = cache["snapshots"]
    assert open_source(TEACHER).folder == snapshots["teacher"]
    assert open_source(TEACHER, "other").folder == snapshots["other"]
    assert open_source(TEACHER, "b" * 40).folder == snapshots["other"]
    assert str(open_source(TEACHER)) == TEACHER  # messages and JSON name the id
    with pytest.raises(
        FileNotFoundError,
        match=r"'tiny-org/teacher' at revision 'v9' is no folder here.*hf download tiny-org/teacher --revision v9",
    ):
        open_source(TEACHER, "v9")
    with pytest.raises(ValueError, match=r"model source '.*teacher' is not a Hub repo id"):
        open_source(cache["folders"]["teacher"], "other")


def test_convert_reads_the_id_at_its_revision(cache, tmp_path):
    common = ["--num-key-value-layers", "3", "--init", "copy", "--no-measure"]
    for revision, snapshot in ((None, "teacher"), ("other", "other")):
        out = tmp_path / snapshot
        given = ["--revision", revision] if revision else []
        assert main(["convert", TEACHER, str(out), *common, *given]) == 0
        written = load_file(out / "model.safetensors")
        source = load_file(cache["snapshots"][snapshot] / "model.safetensors")
        name = "model.layers.0.self_attn.q_proj.weight"
        assert written[name].equal(source[name])
    assert not load_file(tmp_path / "teacher" / "model.safetensors")[name].equal(written[name])


def replies_args(data: Path, out: Path) -> list[str]:
    return [
        "--data", str(data), "--out", str(out), "--tokens", "256", "--heldout-tokens", "64",
        "--reply-tokens", "4", "--engine", "hf", "--dtype", "float32",
    ]  # fmt: skip


def test_replies_of_an_id_are_its_folders_replies(cache, tmp_path):
    data = write_jsonl(tmp_path / "chats.jsonl", random_chats(30, seed=3))
    by_id, by_folder = tmp_path / "id.jsonl", tmp_path / "folder.jsonl"
    assert main(["replies", TEACHER, *replies_args(data, by_id)]) == 0
    assert main(["replies", str(cache["folders"]["teacher"]), *replies_args(data, by_folder)]) == 0
    replies = read_replies(by_id)
    assert replies and replies == read_replies(by_folder)


TRAIN_ARGS = [
    "--tokens", "256", "--heldout-tokens", "64", "--seq-len", "32", "--batch-size", "4", "--micro-batch", "1",
    "--init", "keep", "--targets", "human", "--dtype", "float32", "--eval-every", "2",
]  # fmt: skip


def test_distill_takes_its_teacher_by_id_and_checks_it(cache, tmp_path, capsys):
    data = write_jsonl(tmp_path / "chats.jsonl", random_chats(40, seed=7))
    student = str(cache["folders"]["student"])
    run = ["distill", student, "--data", str(data), "--teacher", TEACHER, *TRAIN_ARGS]
    assert main([*run, "--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "config.json").is_file()
    capsys.readouterr()
    # The other branch holds another model: the run's teacher check refuses it, so --teacher-revision is read.
    assert main([*run, "--out", str(tmp_path / "refused"), "--teacher-revision", "other"]) == 2
    assert "tiny-org/teacher" in one_error(capsys, "distill") and not (tmp_path / "refused").exists()


def test_eval_scores_against_a_teacher_by_id(cache, tmp_path):
    out = tmp_path / "report"
    argv = [
        "eval", str(cache["folders"]["student"]), "--teacher", TEACHER, "--tasks", "none",
        "--chat-conversations", "0", "--gen-prompts", "1", "--gen-tokens", "2", "--long-prompts", "0",
        "--dtype", "float32", "--out", str(out), "--cache", str(tmp_path / "c.sqlite"), "--no-progress",
    ]  # fmt: skip
    assert main(argv) == 0
    assert json.loads((out / "results.json").read_text())["teacher"] == TEACHER


def test_serve_gives_vllm_the_cached_folder_not_the_revision(cache):
    from swiftkv.vllm.serve import server_command

    with patch.dict(os.environ):  # the server's environment, set up for the exec that does not follow
        command = server_command(STUDENT, ["--revision", "main", "--port", "8001"])
    assert str(cache["snapshots"]["student"]) in command and STUDENT in command  # served under its id
    assert "--revision" not in command and command[-2:] == ["--port", "8001"]


def test_the_plan_needs_only_the_config(cache, tmp_path, monkeypatch):
    config_only = tmp_path / "config-only"
    config_only.mkdir()
    shutil.copy(cache["folders"]["teacher"] / "config.json", config_only)
    cache_repo(cache["cache"], "tiny-org/config-only", config_only, "d" * 40)
    argv = ["distill", "tiny-org/config-only", "--plan", "--plan-device", "cpu", "--plan-steps", "0"]
    assert main([*argv, "--json", str(tmp_path / "plan.json")]) == 0
    assert (tmp_path / "plan.json").is_file()


@pytest.mark.parametrize(
    "command, argv",
    [
        ("convert", [MISSING, "{tmp}/out", "--num-key-value-layers", "3"]),
        ("replies", [MISSING, "--data", "{data}", "--out", "{tmp}/out.jsonl"]),
        ("distill", ["{student}", "--data", "{data}", "--teacher", MISSING, "--out", "{tmp}/out"]),
        ("eval", ["{student}", "--teacher", MISSING, "--tasks", "none", "--out", "{tmp}/out"]),
        ("serve", [MISSING, "--port", "8001"]),
    ],
)
def test_an_id_not_cached_offline_is_one_error_before_any_work(
    cache, tmp_path, capsys, monkeypatch, command, argv
):
    def no_load(*args, **kwargs):
        raise AssertionError("a model loaded before the missing id was reported")

    monkeypatch.setattr("transformers.AutoModelForCausalLM.from_pretrained", no_load)
    data = write_jsonl(tmp_path / "chats.jsonl", random_chats(10, seed=1))
    given = dict(tmp=tmp_path, data=data, student=cache["folders"]["student"])
    assert main([command, *(a.format(**given) for a in argv)]) == 2
    error = one_error(capsys, command)
    assert f"model {MISSING!r} is no folder here, nor a Hub model in the Hugging Face cache" in error
    assert "HF_HUB_OFFLINE=1" in error and f"hf download {MISSING}" in error
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chats.jsonl"]  # nothing written
