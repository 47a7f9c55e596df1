"""`swiftkv distill --snapshot-every` and `--profile-steps` on a tiny folder: a run killed (SIGKILL) after a
wall-clock snapshot resumes when the same command runs again and ends as an unkilled run; a profiled run
trains as an unprofiled one; bad snapshot folders and values are one error each."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

from swiftkv.cli import main
from swiftkv.distill.start.snapshot import read_progress, write_snapshot
from swiftkv.model import swiftkv_parameters
from tests.test_distill_cli import TRAIN_ARGS
from tests.tiny import random_chats, save_tiny_folder, write_jsonl

# 64 steps of 4 x 32 tokens; the regular checkpoint never falls due before the last step, so the checkpoint
# a killed run leaves is a wall-clock snapshot's.
LONG_RUN = ["--tokens", "8192", "--checkpoint-every", "1000", "--eval-every", "1000"]


@pytest.fixture
def tiny_run(tmp_path):
    folder = save_tiny_folder(tmp_path / "student")
    data = write_jsonl(tmp_path / "chats.jsonl", random_chats(200, seed=7))
    return tmp_path, folder, data


def distill_args(folder, data, out, *extra):
    return ["distill", str(folder), "--data", str(data), "--out", str(out), *TRAIN_ARGS, *LONG_RUN, *extra]


def losses(out) -> list[float]:
    summary = json.loads((out / "distill.json").read_text())
    return [h["loss"] for h in summary["history"] if "loss" in h]


def trained_weights(out) -> dict[str, torch.Tensor]:
    return swiftkv_parameters(AutoModelForCausalLM.from_pretrained(out))


@pytest.mark.slow  # three runs of 64 steps, one of them a process of its own
def test_a_run_killed_after_a_snapshot_resumes_with_the_same_command_to_the_same_numbers(tiny_run):
    """SIGKILL from outside as soon as the first snapshot is on disk; the same command again resumes from
    it (no --resume) and ends with the unkilled run's losses and weights, equal exactly (a run is a pure
    function of its settings and step, and the snapshot keeps the fp32 tensors and AdamW's state)."""
    tmp_path, folder, data = tiny_run
    out = tmp_path / "out"
    command = distill_args(folder, data, out, "--snapshot-every", "0.05")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}
    process = subprocess.Popen(
        [sys.executable, "-m", "swiftkv.cli", *command],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    snapshot = tmp_path / "out.ckpt" / "checkpoint.pt"
    deadline = time.time() + 300
    while not snapshot.exists() and process.poll() is None and time.time() < deadline:
        time.sleep(0.005)
    process.send_signal(signal.SIGKILL)
    _, err = process.communicate(timeout=60)
    assert process.returncode == -9, err[-2000:]
    assert not out.exists()
    step = torch.load(snapshot, weights_only=False)["state"]["step"]
    assert 0 < step < 64, step  # killed mid-run, after a snapshot that no step count made due

    assert main(command) == 0  # the same command
    assert main(distill_args(folder, data, tmp_path / "straight")) == 0
    assert losses(out) == losses(tmp_path / "straight") and len(losses(out)) == 64
    resumed, straight = trained_weights(out), trained_weights(tmp_path / "straight")
    for name, tensor in straight.items():
        assert torch.equal(resumed[name], tensor), name


def test_a_snapshotting_run_resumes_from_the_checkpoint_it_left_and_force_starts_over(tiny_run, capsys):
    tmp_path, folder, data = tiny_run
    out = tmp_path / "out"
    assert main(distill_args(folder, data, out, "--snapshot-every", "3600", "--stop-after", "3")) == 0
    assert "resuming" not in capsys.readouterr().out
    assert main(distill_args(folder, data, out, "--snapshot-every", "3600", "--stop-after", "5")) == 0
    assert f"resuming {tmp_path / 'out.ckpt' / 'checkpoint.pt'} after step 3" in capsys.readouterr().out
    # Without --snapshot-every an existing checkpoint still needs --resume or --force.
    assert main(distill_args(folder, data, out, "--stop-after", "6")) == 2
    assert "pass --resume to continue it or --force" in capsys.readouterr().err
    assert (
        main(distill_args(folder, data, out, "--snapshot-every", "3600", "--stop-after", "1", "--force")) == 0
    )
    state = torch.load(tmp_path / "out.ckpt" / "checkpoint.pt", weights_only=False)["state"]
    assert state["step"] == 1


def test_a_checkpoint_folder_of_another_layout_is_one_error_naming_what_was_expected(tiny_run, capsys):
    tmp_path, folder, data = tiny_run
    old = tmp_path / "out.ckpt"
    old.mkdir()
    (old / "0.safetensors").write_bytes(b"x")
    (old / "progress.json").write_text("{}")
    assert main(distill_args(folder, data, tmp_path / "out", "--snapshot-every", "60")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "holds 0.safetensors, progress.json but no checkpoint.pt" in err
    assert "expected checkpoint.pt, and shards-stepNNNNNNNN/ beside it under --fsdp" in err


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--snapshot-every", "0", "--snapshot-every 0.0: expected a number of seconds above 0"),
        ("--profile-steps", "0", "--profile-steps 0: expected a number of steps, at least 1"),
    ],
)
def test_bad_snapshot_and_profile_values_are_refused_before_any_work(
    tiny_run, capsys, option, value, message
):
    tmp_path, folder, data = tiny_run
    assert main(distill_args(folder, data, tmp_path / "out", option, value)) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out.ckpt").exists()


def test_profiled_steps_train_as_unprofiled_ones_and_the_report_says_where_the_time_goes(tiny_run, capsys):
    tmp_path, folder, data = tiny_run
    short = ["--stop-after", "6"]
    assert main(distill_args(folder, data, tmp_path / "plain", *short)) == 0
    capsys.readouterr()
    assert main(distill_args(folder, data, tmp_path / "profiled", *short, "--profile-steps", "3")) == 0
    printed = capsys.readouterr().out
    assert (
        "profile of 3 steps:" in printed
        and "ms wall per step" in printed
        and "ms of cpu self time" in printed
    )
    assert "Self CPU" in printed  # the table of the ops with the most self time
    plain = torch.load(tmp_path / "plain.ckpt" / "checkpoint.pt", weights_only=False)
    profiled = torch.load(tmp_path / "profiled.ckpt" / "checkpoint.pt", weights_only=False)
    assert [h["loss"] for h in plain["state"]["history"] if "loss" in h] == [
        h["loss"] for h in profiled["state"]["history"] if "loss" in h
    ]
    for name, tensor in plain["trained"].items():
        assert torch.equal(profiled["trained"][name], tensor), name


def test_a_student_snapshot_of_another_layout_names_the_files_and_keys_it_expected(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"0\.safetensors is missing: .* is not a student snapshot"):
        read_progress(tmp_path)
    save_file({"w": torch.zeros(2)}, str(tmp_path / "0.safetensors"), metadata={"progress": json.dumps({})})
    with pytest.raises(
        ValueError, match="lacks num_key_value_layers, key_value_group_size, trainable, lora_rank"
    ):
        read_progress(tmp_path)
    student = {"num_key_value_layers": 3, "key_value_group_size": 1, "trainable": "lora", "lora_rank": 4}
    tensors = {f"t{i}": torch.full((1024,), float(i)) for i in range(3)}  # 2 KiB each in bf16
    write_snapshot(tmp_path / "cut", tensors, student | {"step": 7}, file_limit=4096)
    assert sorted(p.name for p in (tmp_path / "cut").iterdir()) == ["0.safetensors", "1.safetensors"]
    assert read_progress(tmp_path / "cut")["step"] == 7
