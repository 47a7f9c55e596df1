"""`swiftkv distill` end to end on a tiny folder: output format, bad input, and DDP under torchrun."""

import json
import os
import re
import shlex
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM

from swiftkv.cli import build_parser, main
from swiftkv.distill.measure.speed import TIMED_STEPS
from swiftkv.model import swiftkv_parameters
from tests.tiny import random_chats, save_tiny_folder, tiny_student, write_jsonl

TRAIN_ARGS = [
    "--recipe",  # named, so that each run's stderr holds only what the test looks for
    "swiftkv",
    "--tokens",
    "512",
    "--heldout-tokens",
    "64",
    "--seq-len",
    "32",
    "--batch-size",
    "4",
    "--micro-batch",
    "1",
    "--lr",
    "5e-3",
    "--eval-every",
    "2",
    "--checkpoint-every",
    "2",
    # the settings of the plain recipe these tests were written for (no vLLM, exact in fp32)
    "--init",
    "keep",
    "--targets",
    "human",
    "--mse-weight",
    "0",
    "--kl-mean-over",
    "targets",
    "--dtype",
    "float32",
]


@pytest.fixture
def tiny_run(tmp_path):
    folder = save_tiny_folder(tmp_path / "student")
    data = write_jsonl(tmp_path / "chats.jsonl", random_chats(60, seed=7))
    return tmp_path, folder, data


def distill_args(folder, data, out, *extra):
    return ["distill", str(folder), "--data", str(data), "--out", str(out), *TRAIN_ARGS, *extra]


def test_cli_writes_a_swiftkv_folder_where_only_swiftkv_weights_changed(tiny_run):
    tmp_path, folder, data = tiny_run
    assert main(distill_args(folder, data, tmp_path / "out")) == 0
    source = AutoModelForCausalLM.from_pretrained(folder)
    distilled = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert distilled.config.swiftkv is True
    trained = set(swiftkv_parameters(distilled))
    for name, tensor in distilled.state_dict().items():
        same = torch.equal(tensor, source.state_dict()[name])
        assert same != (name in trained), name
    summary = json.loads((tmp_path / "out" / "distill.json").read_text())
    assert summary["steps"] == 4 and summary["train_tokens"] == 512
    assert summary["compute_dtype"] == "float32"  # what the steps ran in, beside the setting as given
    assert summary["heldout_after"]["kl"] < summary["heldout_before"]["kl"]
    # --eval-only on the written folder reproduces the run's final held-out numbers (same split).
    assert (
        main(
            [
                "distill",
                str(tmp_path / "out"),
                "--data",
                str(data),
                *TRAIN_ARGS,
                "--eval-only",
                "--json",
                str(tmp_path / "eval.json"),
            ]
        )
        == 0
    )
    evaluated = json.loads((tmp_path / "eval.json").read_text())
    assert abs(evaluated["kl"] - summary["heldout_after"]["kl"]) < 1e-6
    assert evaluated["top1"] == summary["heldout_after"]["top1"]


def test_cli_bad_input_is_one_error_and_overwrites_nothing(tiny_run, capsys):
    tmp_path, folder, data = tiny_run
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "keep.txt").write_text("mine")
    latin1 = tmp_path / "latin1.jsonl"
    latin1.write_bytes(data.read_bytes() + b'{"text": "caf\xe9"}\n')
    cases = [
        (distill_args(folder, data, tmp_path / "taken"), "already exists"),
        (
            distill_args(folder, data, tmp_path / "o1", "--seq-len", "512"),
            "exceeds the model's max_position_embeddings 256",
        ),
        (distill_args(folder, tmp_path / "missing.jsonl", tmp_path / "o2"), "missing.jsonl"),
        (distill_args(folder, data, tmp_path / "o3", "--resume"), "no checkpoint"),
        (
            distill_args(folder, data, tmp_path / "o4", "--batch-size", "3", "--micro-batch", "2"),
            "--batch-size 3",
        ),
        (distill_args(folder, latin1, tmp_path / "o5"), f"{latin1}:61: invalid UTF-8 (byte 0xe9"),
    ]
    for args, message in cases:
        assert main(args) == 2, args
        errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
        assert len(errors) == 1 and message in errors[0], errors
    assert (tmp_path / "taken" / "keep.txt").read_text() == "mine"
    assert not any((tmp_path / f"o{i}").exists() for i in range(1, 6))


def test_cli_refuses_a_teacher_the_student_was_not_converted_from(tiny_run, capsys):
    tmp_path, folder, data = tiny_run
    other = save_tiny_folder(tmp_path / "other", tiny_student(seed=9))
    assert main(distill_args(folder, data, tmp_path / "o", "--teacher", str(other))) == 2
    assert "differs from the student's copy" in capsys.readouterr().err
    assert (
        main(distill_args(folder, data, tmp_path / "o", "--teacher", str(folder), "--stop-after", "1")) == 0
    )


def torchrun_distill(nproc: int, args: list[str], check: bool = True) -> subprocess.CompletedProcess:
    """`torchrun --nproc-per-node NPROC -m swiftkv.cli ARGS` (gloo, one thread per process)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    result = subprocess.run(
        [*command, "-m", "swiftkv.cli", *args], env=env, capture_output=True, text=True, timeout=400
    )
    assert result.returncode == 0 or not check, result.stderr[-3000:]
    return result


def run_torchrun(nproc: int, folder, data, out) -> dict:
    torchrun_distill(nproc, distill_args(folder, data, out, "--json", f"{out}.json"))
    return json.loads(open(f"{out}.json").read())


def test_two_gloo_processes_follow_the_one_process_loss_curve(tiny_run):
    tmp_path, folder, data = tiny_run
    one = run_torchrun(1, folder, data, tmp_path / "one")
    two = run_torchrun(2, folder, data, tmp_path / "two")
    losses = [[h["loss"] for h in run["history"] if "loss" in h] for run in (one, two)]
    assert len(losses[0]) == len(losses[1]) == 4
    assert max(abs(a - b) / a for a, b in zip(*losses, strict=True)) < 1e-5
    assert abs(one["heldout_after"]["kl"] - two["heldout_after"]["kl"]) < 1e-5
    first = swiftkv_parameters(AutoModelForCausalLM.from_pretrained(tmp_path / "one"))
    second = swiftkv_parameters(AutoModelForCausalLM.from_pretrained(tmp_path / "two"))
    assert max((first[n] - second[n]).abs().max().item() for n in first) < 1e-5


def test_resume_knows_the_model_by_content_not_by_path(tiny_run, capsys, monkeypatch):
    """The same folder given by a relative and then an absolute path resumes; another model put in
    the same folder is refused, before any work, naming what differs."""
    tmp_path, folder, data = tiny_run
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    assert main(distill_args(folder.name, data, out, "--stop-after", "2")) == 0
    assert main(distill_args(folder.resolve(), data, out, "--resume", "--stop-after", "3")) == 0

    save_tiny_folder(folder, tiny_student(num_key_value_layers=2))  # replaced: another N
    capsys.readouterr()
    monkeypatch.setattr(
        "swiftkv.distill.run.load_student", lambda settings: pytest.fail("loaded before the check")
    )
    assert main(distill_args(folder, data, out, "--resume")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is from another model or run configuration" in err, err
    assert "model num_key_value_layers: checkpoint 3 vs now 2" in err and "model weights: checkpoint" in err


def test_resume_accepts_a_checkpoint_written_before_model_identities(tiny_run, capsys):
    """Checkpoints of older runs hold the source path string in place of the model's identity, and
    lack settings added since (read as their defaults): they still resume, compared as they were
    written; a non-default value of such a setting is still another run."""
    tmp_path, folder, data = tiny_run
    out = tmp_path / "out"
    assert main(distill_args(folder, data, out, "--stop-after", "2")) == 0
    path = tmp_path / "out.ckpt" / "checkpoint.pt"
    payload = torch.load(path, weights_only=False)
    # the old format: the training settings and the source as given, no "model ..." keys
    old = {
        k: v for k, v in payload["fingerprint"].items() if not k.startswith("model ") and k != "top1_weight"
    }
    torch.save(payload | {"fingerprint": old | {"source": str(folder)}}, path)
    assert main(distill_args(folder, data, out, "--resume", "--top1-weight", "1", "--stop-after", "3")) == 2
    assert "top1_weight: checkpoint 0.0 vs now 1.0" in capsys.readouterr().err
    assert main(distill_args(folder, data, out, "--resume", "--stop-after", "3")) == 0


KILL_AT_SECOND_CHECKPOINT = """
import os, signal, sys, torch
from swiftkv.cli import main

original, calls = torch.save, []

def save_then_die(obj, path, *args, **kwargs):
    original(obj, path, *args, **kwargs)
    calls.append(path)
    if len(calls) == 2:                    # the second checkpoint is in its temp file, not yet renamed
        os.kill(os.getpid(), signal.SIGKILL)

torch.save = save_then_die
sys.exit(main(sys.argv[1:]))
"""


def test_a_distill_killed_mid_checkpoint_resumes_to_the_same_weights(tiny_run):
    """A real SIGKILL while the second checkpoint is written: the first checkpoint survives, --resume
    continues from it, nothing half-written remains, and the result equals an uninterrupted run."""
    tmp_path, folder, data = tiny_run
    out = tmp_path / "out"
    killed = subprocess.run(
        [sys.executable, "-c", KILL_AT_SECOND_CHECKPOINT, *distill_args(folder, data, out)],
        capture_output=True,
        text=True,
    )
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert not out.exists()
    checkpoints = tmp_path / "out.ckpt"
    assert any(".tmp-" in p.name for p in checkpoints.iterdir())  # the torn temp file of the killed run
    assert main(distill_args(folder, data, out, "--resume")) == 0
    assert not any(".tmp-" in p.name for p in checkpoints.iterdir())
    assert main(distill_args(folder, data, tmp_path / "straight")) == 0
    resumed = AutoModelForCausalLM.from_pretrained(out).state_dict()
    straight = AutoModelForCausalLM.from_pretrained(tmp_path / "straight").state_dict()
    for name in swiftkv_parameters(AutoModelForCausalLM.from_pretrained(out)):
        assert torch.equal(resumed[name], straight[name]), name


def parsed_mode(*flags: str) -> tuple[str, int | None]:
    args = build_parser().parse_args(["distill", "folder", *flags])
    return args.mode, args.timed_steps


def test_one_mode_per_command_by_mode_or_by_its_older_flag(capsys):
    assert parsed_mode() == ("train", TIMED_STEPS)
    assert parsed_mode("--mode", "speed", "--timed-steps", "3") == parsed_mode("--speed", "3") == ("speed", 3)
    assert parsed_mode("--compare-naive", "2") == ("compare-naive", 2)
    assert parsed_mode("--plan", "--plan-steps", "0") == parsed_mode("--mode", "plan", "--timed-steps", "0")
    assert parsed_mode("--eval-only")[0] == "eval-only"
    assert parsed_mode("--plan", "--mode", "plan")[0] == "plan"  # the same mode twice is one
    for flags in (("--plan", "--speed", "1"), ("--mode", "eval-only", "--compare-naive", "1")):
        with pytest.raises(SystemExit):
            parsed_mode(*flags)
        assert "ask for two modes; give one --mode (train, plan, speed" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parsed_mode("--mode", "fast")
    assert "invalid choice: 'fast'" in capsys.readouterr().err


def test_speed_times_the_runs_own_blocks_and_a_run_records_its_bound(tiny_run):
    """--speed builds the blocks the run would train on: with teacher replies (written first, here by the
    hf engine) the loss covers only their tokens, so the step's FLOPs per token are those of a run on the
    same blocks, and fewer than with the data's longer human answers as targets. A run's summary puts its
    own tokens/s against that bound."""
    tmp_path, folder, data = tiny_run
    common = [
        "distill", str(folder), "--data", str(data), "--seq-len", "32", "--batch-size", "2",
        "--heldout-tokens", "64", "--micro-batch", "1", "--dtype", "float32", "--init", "keep",
    ]  # fmt: skip
    teacher = [
        "--targets", "teacher", "--reply-engine", "hf", "--reply-tokens", "4",
        "--teacher-data", str(tmp_path / "replies.jsonl"),
    ]  # fmt: skip

    def bound(*args: str) -> dict:
        assert main([*common, *args, "--json", str(tmp_path / "out.json")]) == 0
        return json.loads((tmp_path / "out.json").read_text())

    probe = bound(*teacher, "--mode", "speed", "--timed-steps", "1")["compute_bound"]
    # a run of the probe's blocks: its warm-up step and its timed one, 2 x 32 tokens each
    run = bound(*teacher, "--tokens", "128", "--out", str(tmp_path / "run"))
    assert run["compute_bound"]["flops_per_token"] == probe["flops_per_token"]
    human = bound("--targets", "human", "--speed", "1")["compute_bound"]  # the mode's older flag
    assert human["flops_per_token"] > probe["flops_per_token"]
    facts = run["compute_bound"]
    rate = run["tokens_per_second"] * facts["flops_per_token"] / facts["matmul_peak_flops"]
    # a tiny model's fraction is ~1e-3 and may round to 0.0 on a loaded machine: the rate itself is checked
    assert facts["fraction_of_bound"] == round(rate, 3) and 0 < rate < 1


def test_compare_naive_measures_both_ways_against_the_devices_matmul_peak(tiny_run):
    """--compare-naive / --speed run on the training device (the CPU here) with --micro-batch auto
    resolved, and put the step's FLOPs against the measured matmul peak in the compute dtype."""
    tmp_path, folder, data = tiny_run
    args = [
        "distill",
        str(folder),
        "--data",
        str(data),
        "--seq-len",
        "32",
        "--batch-size",
        "2",
        "--heldout-tokens",
        "64",  # the run's split, which the probe's blocks come from
        "--dtype",
        "float32",
        "--targets",
        "human",
        "--init",
        "keep",
        "--mode",
        "compare-naive",
        "--timed-steps",
        "1",
        "--json",
        str(tmp_path / "speed.json"),
    ]
    assert main(args) == 0
    result = json.loads((tmp_path / "speed.json").read_text())
    assert result["device"] == "cpu" and result["dtype"] == "float32" and result["micro_batch"] == 2
    assert result["shared"]["tokens_per_s"] > 0 and result["naive"]["tokens_per_s"] > 0
    bound = result["compute_bound"]
    # the recorded fraction is rounded to 3 places: a tiny model's (~1e-3) may read 0.0 on a loaded machine
    rate = result["shared"]["tokens_per_s"] * bound["flops_per_token"] / bound["matmul_peak_flops"]
    assert bound["matmul_peak_flops"] > 1e9 and 0 < rate < 1 and bound["fraction_of_bound"] == round(rate, 3)
    assert result["trainable"] == "swiftkv" and result["peak_memory_mib"] > 100 and not result["compiled"]
    # --compile: the decoder layers timed as a training run compiles them (inductor, on this CPU).
    assert main([*args[:-2], "--compile", "--json", str(tmp_path / "compiled.json")]) == 0
    assert json.loads((tmp_path / "compiled.json").read_text())["compiled"]
    # A capacity arm: its own trainable set, and the FLOPs of its extra weight gradients in the bound.
    assert main([*args[:-2], "--trainable", "late", "--json", str(tmp_path / "late.json")]) == 0
    late = json.loads((tmp_path / "late.json").read_text())
    assert late["trainable"] == "late" and late["trained_parameters"] > 2 * result["trained_parameters"]
    assert late["compute_bound"]["flops_per_token"] > bound["flops_per_token"]


@pytest.mark.slow  # two torchrun processes and the hf replies engine
def test_under_torchrun_replies_are_written_first_by_the_command_the_refusal_gives(tiny_run):
    """No process of a torchrun group writes replies (the others would wait in a collective that NCCL ends
    after 10 minutes): a run that needs them and finds them missing stops before any group with the exact
    `swiftkv replies` command; once that command has run, 2 processes train on what it wrote, and their
    loss curve is one process's."""
    tmp_path, folder, data = tiny_run
    teacher = ["--targets", "teacher", "--reply-engine", "hf", "--reply-tokens", "4", "--dtype", "float32"]
    teacher += ["--teacher-data", str(tmp_path / "replies.jsonl")]
    refused = torchrun_distill(2, distill_args(folder, data, tmp_path / "two", *teacher), check=False)
    assert refused.returncode != 0 and not (tmp_path / "two").exists()
    command = re.search(
        r"write them first with `(swiftkv replies [^`]+)`, then run this command again", refused.stderr
    )
    assert command, refused.stderr[-3000:]
    # the first process to stop has torchrun end the other, whose own error may not be printed
    assert "swiftkv distill: error: --targets teacher under torchrun" in refused.stderr
    assert main(shlex.split(command[1])[1:]) == 0  # the command as printed, in this process
    torchrun_distill(
        2, distill_args(folder, data, tmp_path / "two", *teacher, "--json", str(tmp_path / "two.json"))
    )
    two = json.loads((tmp_path / "two.json").read_text())
    # one process under torchrun, as the DDP test compares: the same threads per process as the two
    torchrun_distill(
        1, distill_args(folder, data, tmp_path / "one", *teacher, "--json", str(tmp_path / "one.json"))
    )
    one = json.loads((tmp_path / "one.json").read_text())
    losses = [[h["loss"] for h in run["history"] if "loss" in h] for run in (one, two)]
    # fp32 gradients summed in another order over fewer (reply-only) loss tokens: 1.04e-5 measured
    assert max(abs(a - b) / a for a, b in zip(*losses, strict=True)) < 5e-5
