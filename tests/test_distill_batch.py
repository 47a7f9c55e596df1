"""--batch-size is the global batch: blocks per optimizer step over all processes, split into the
processes x --micro-batch. One that does not split is one error naming the batch, the world size, the
micro-batch and the nearest batch that splits, raised before any model is loaded."""

import pytest

from swiftkv.cli import main
from swiftkv.distill.core import microbatch
from swiftkv.distill.settings import settings_for
from tests.tiny import random_chats, save_tiny_folder, write_jsonl


@pytest.mark.parametrize(
    ("batch", "world", "micro", "nearest"),
    [
        (3, 1, 2, 4),  # 2 and 4 are as near: the larger, so at least the blocks asked for train
        (2, 8, "auto", 8),  # the 135M default on a node of 8: below one block per process
        (10, 8, 1, 8),
        (20, 8, 1, 24),
        (64, 8, 16, 128),
        (0, 2, 1, 2),
    ],
)
def test_a_batch_that_does_not_split_names_the_numbers_and_the_nearest_that_does(
    batch, world, micro, nearest
):
    expected = (
        f"--batch-size {batch} (the global batch) does not split over {world} process(es) x --micro-batch "
        f"{micro}: expected a multiple of {world * (1 if micro == 'auto' else micro)}, e.g. --batch-size "
        f"{nearest}"
    )
    with pytest.raises(ValueError) as error:
        microbatch.check_split(batch, world, micro)
    assert str(error.value) == expected
    microbatch.check_split(nearest, world, micro)  # the one it names splits


@pytest.mark.parametrize(("batch", "world", "micro"), [(8, 8, 1), (64, 8, "auto"), (64, 8, 4), (6, 3, 2)])
def test_a_batch_that_splits_passes(batch, world, micro):
    microbatch.check_split(batch, world, micro)


def test_the_settings_check_the_recipe_batch_at_a_world_size():
    large = settings_for("m", "reference-large")
    for world in (1, 2, 4, 8):
        large.check_batch_split(world)  # 8 blocks of one forward each: any power of two up to 8
    with pytest.raises(ValueError, match="--batch-size 8 .* over 16 process.* e.g. --batch-size 16"):
        large.check_batch_split(16)
    with pytest.raises(ValueError, match="--batch-size 2 .* over 8 process.* e.g. --batch-size 8"):
        settings_for("m").check_batch_split(8)


@pytest.fixture
def tiny_run(tmp_path):
    folder = save_tiny_folder(tmp_path / "student")
    data = write_jsonl(tmp_path / "chats.jsonl", random_chats(8, seed=1))
    return tmp_path, folder, data


def refuse_loading(monkeypatch):
    """Any model load fails the test: the check must come first."""

    def loaded(*_args, **_kwargs):
        raise AssertionError("a model was loaded before the batch was checked")

    monkeypatch.setattr("swiftkv.distill.run.load_student", loaded)


def test_the_cli_refuses_a_batch_that_does_not_split_before_loading(tiny_run, monkeypatch, capsys):
    tmp_path, folder, data = tiny_run
    refuse_loading(monkeypatch)
    out = tmp_path / "out"
    args = ["distill", str(folder), "--data", str(data), "--out", str(out), "--batch-size", "3"]
    assert main([*args, "--micro-batch", "2"]) == 2
    recipe_line, error = capsys.readouterr().err.strip().splitlines()  # the recipe taken, then one error
    assert recipe_line.startswith("swiftkv distill: recipe swiftkv (the model has ")
    assert error == (
        "swiftkv distill: error: --batch-size 3 (the global batch) does not split over 1 process(es) x "
        "--micro-batch 2: expected a multiple of 2, e.g. --batch-size 4"
    )
    assert not out.exists() and not (tmp_path / "out.ckpt").exists()


def test_under_torchrun_the_world_size_is_checked_before_any_group_or_load(tiny_run, monkeypatch, capsys):
    """torchrun's WORLD_SIZE is read before a process group is joined: no rendezvous is needed to refuse."""
    tmp_path, folder, data = tiny_run
    refuse_loading(monkeypatch)
    monkeypatch.setattr("swiftkv.distill.run.init_world", lambda *_: pytest.fail("joined a group first"))
    monkeypatch.setenv("WORLD_SIZE", "8")
    args = ["distill", str(folder), "--data", str(data), "--out", str(tmp_path / "out"), "--batch-size", "12"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "--batch-size 12 (the global batch) does not split over 8 process(es) x --micro-batch auto" in err
    assert "e.g. --batch-size 16" in err
