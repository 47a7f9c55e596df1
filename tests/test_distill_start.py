"""`start.decide_start`: the one place that decides how a run starts. Each kind (fresh, resume, snapshot,
continue, init) with what it loads and why, and each refusal as one error naming the setting, all before
any work."""

from pathlib import Path

import pytest

from swiftkv.distill.run import distill
from swiftkv.distill.start.decide import KINDS, decide_start
from tests.test_distill_train import run_settings
from tests.tiny import tiny_student, tiny_tokenizer


@pytest.fixture(scope="module")
def earlier(tmp_path_factory):
    """(folder, settings) of an earlier run stopped after 2 of its 4 steps: its checkpoint in folder/ckpt."""
    folder = tmp_path_factory.mktemp("start")
    settings = run_settings(folder, stop_after=2)
    distill(settings, tiny_student(), tiny_tokenizer())
    return folder, settings.but(stop_after=None)


def test_each_kind_says_what_it_loads_and_why(earlier, tmp_path):
    folder, settings = earlier
    ckpt = folder / "ckpt" / "checkpoint.pt"
    out = str(tmp_path / "out")
    starts = {
        "fresh": decide_start(settings.but(out=out, checkpoint_dir=str(tmp_path / "new"))),
        "resume": decide_start(settings.but(out=out, resume=True)),
        "snapshot": decide_start(settings.but(out=out, snapshot_every=60.0)),
        "continue": decide_start(
            settings.but(out=out, checkpoint_dir=str(tmp_path / "c"), continue_from=str(folder / "ckpt"))
        ),
        "init": decide_start(
            settings.but(out=out, checkpoint_dir=str(tmp_path / "i"), init_from=str(folder / "ckpt"))
        ),
    }
    assert tuple(starts) == KINDS and all(start.kind == kind for kind, start in starts.items())
    assert starts["fresh"].load is None and starts["fresh"].checkpoint == tmp_path / "new" / "checkpoint.pt"
    assert starts["fresh"].why == "a fresh start: the SwiftKV parameters of --init keep"
    assert (
        starts["resume"].load == ckpt and starts["resume"].why == f"resuming {ckpt} after step 2 (--resume)"
    )
    assert starts["snapshot"].load == ckpt
    assert starts["snapshot"].why.endswith("after step 2 (the same --snapshot-every command again)")
    assert [s.resumes for s in starts.values()] == [False, True, True, False, False]
    assert (starts["continue"].load, starts["continue"].continued_steps) == (ckpt, 2)
    assert starts["continue"].why == f"continuing {ckpt}: its trained tensors, after 2 steps of the data"
    assert starts["init"].load == ckpt and starts["init"].continued_steps == 0
    # A library call (no output folder) over an existing checkpoint: no refusal, no snapshot resume.
    library = decide_start(settings.but(snapshot_every=60.0), writes_output=False)
    assert library.kind == "fresh"


def refusals(folder: Path, tmp_path: Path) -> list[tuple[dict, type, str]]:
    """(changed settings, error type, message) for each start refused."""
    ckpt = str(folder / "ckpt")
    new = str(tmp_path / "new")
    (tmp_path / "written").mkdir()
    (tmp_path / "odd.ckpt").mkdir()
    (tmp_path / "odd.ckpt" / "model.safetensors").write_bytes(b"")
    return [
        ({"out": None}, ValueError, "--out is required"),
        ({"out": str(tmp_path / "written")}, FileExistsError, "written"),
        ({}, FileExistsError, "a checkpoint exists at .*; pass --resume to continue it or --force"),
        ({"resume": True, "checkpoint_dir": new}, FileNotFoundError, "--resume: no checkpoint at"),
        ({"resume": True, "lr": 1e-3}, ValueError, "another model or run configuration .*lr: checkpoint"),
        ({"resume": True, "fsdp": True}, ValueError, "was written without --fsdp .*resume it without --fsdp"),
        ({"passes": 0}, ValueError, "--passes 0: expected a whole number of passes"),
        ({"snapshot_every": -1.0}, ValueError, "--snapshot-every -1.0: expected a number of seconds above 0"),
        ({"profile_steps": 0}, ValueError, "--profile-steps 0: expected a number of steps"),
        ({"fsdp": True, "naive": True}, ValueError, "--fsdp with --naive"),
        ({"skip_tokens": -1}, ValueError, "--skip-tokens -1: expected a count"),
        (
            {"snapshot_every": 5.0, "checkpoint_dir": str(tmp_path / "odd.ckpt")},
            ValueError,
            "holds model.safetensors but no checkpoint.pt",
        ),
        (
            {"continue_from": ckpt, "checkpoint_dir": new, "seed": 1},
            ValueError,
            "another student or data .*seed: checkpoint 0 vs now 1",
        ),
        (
            {"continue_from": ckpt, "checkpoint_dir": new, "passes": 2},
            ValueError,
            "its pass over the data held",
        ),
        (
            {"continue_from": new, "checkpoint_dir": new},
            FileNotFoundError,
            "--continue-from .*no checkpoint there",
        ),
        (
            {"init_from": ckpt, "checkpoint_dir": new, "trainable": "lora", "lora_rank": 4},
            ValueError,
            "another student .*trainable: checkpoint 'swiftkv' vs now 'lora'",
        ),
        ({"init_from": new, "checkpoint_dir": new}, FileNotFoundError, "--init-from .*no checkpoint there"),
    ]


def test_each_refusal_is_one_error_naming_the_setting(earlier, tmp_path):
    folder, settings = earlier
    for changes, error, message in refusals(folder, tmp_path):
        with pytest.raises(error, match=message):
            decide_start(settings.but(**{"out": str(tmp_path / "out"), **changes}))
