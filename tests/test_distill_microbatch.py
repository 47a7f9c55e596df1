"""--micro-batch: a number, or auto (on CUDA the largest divisor of the per-process batch that fits,
found by trying; on CPU 2). The step is the same for any size, so auto only trades memory for speed."""

import argparse

import pytest
import torch

from swiftkv.distill.core import microbatch
from swiftkv.distill.core.trainer import swiftkv_parameters
from swiftkv.distill.run import distill
from tests.test_distill_train import run_settings
from tests.tiny import tiny_student, tiny_tokenizer


def test_parse_takes_auto_or_a_positive_count():
    assert microbatch.parse_micro_batch("auto") == "auto" and microbatch.parse_micro_batch("3") == 3
    for bad in ("0", "-2", "two", ""):
        with pytest.raises(
            argparse.ArgumentTypeError, match=f"--micro-batch '{bad}': expected a positive number"
        ):
            microbatch.parse_micro_batch(bad)


def test_the_cli_refuses_a_bad_micro_batch_before_any_work(tmp_path, capsys):
    from swiftkv.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["distill", str(tmp_path / "missing"), "--micro-batch", "0", "--out", str(tmp_path / "o")])
    assert exit_info.value.code == 2
    assert "--micro-batch '0': expected a positive number of blocks or 'auto'" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_auto_keeps_the_largest_divisor_that_fits():
    block_bytes, budget = 3, 10  # a memory model: k blocks need 3k units of 10
    fits = lambda size: size * block_bytes <= budget  # noqa: E731
    assert microbatch.largest_fitting(8, fits) == 2  # 8 and 4 do not fit; 2 does
    assert microbatch.largest_fitting(6, fits) == 3
    assert microbatch.largest_fitting(5, fits) == 1  # only 1 divides 5 below 5
    tried = []
    microbatch.largest_fitting(4, lambda size: tried.append(size) or False)
    assert tried == [4, 2]  # 1 is kept without a try: the run's own first step reports a real OOM


def test_auto_on_cpu_is_two_blocks_and_never_probes():
    def probe(size):
        raise AssertionError("the CPU has no memory probe")

    cpu = torch.device("cpu")
    assert [microbatch.resolve_micro_batch("auto", n, cpu, probe) for n in (1, 2, 3, 4, 16)] == [
        1,
        2,
        1,
        2,
        2,
    ]
    assert microbatch.resolve_micro_batch(4, 16, cpu, probe) == 4  # a number is taken as given


def test_an_auto_run_trains_exactly_as_the_size_it_chose(tmp_path):
    """On CPU auto is 2: the same weights, bit for bit, as --micro-batch 2; the summary says what ran,
    while the checkpoint keeps `auto`, so a resume with auto is the same run."""
    tokenizer = tiny_tokenizer()
    auto, fixed = tiny_student(), tiny_student()
    state = distill(
        run_settings(tmp_path, micro_batch="auto", checkpoint_dir=str(tmp_path / "a")), auto, tokenizer
    )
    distill(run_settings(tmp_path, micro_batch=2, checkpoint_dir=str(tmp_path / "b")), fixed, tokenizer)
    assert state.micro_batch == 2
    for name, parameter in swiftkv_parameters(auto).items():
        assert torch.equal(parameter, swiftkv_parameters(fixed)[name]), name
    saved = torch.load(tmp_path / "a" / "checkpoint.pt", weights_only=False)
    assert saved["fingerprint"]["micro_batch"] == "auto"
    resumed = distill(
        run_settings(tmp_path, micro_batch="auto", checkpoint_dir=str(tmp_path / "a"), resume=True),
        tiny_student(),
        tokenizer,
    )
    assert resumed.step == state.step


def test_sizes_give_the_same_step_up_to_rounding(tmp_path):
    tokenizer = tiny_tokenizer()
    one, four = tiny_student(), tiny_student()
    distill(run_settings(tmp_path, micro_batch=1, checkpoint_dir=str(tmp_path / "m1")), one, tokenizer)
    distill(run_settings(tmp_path, micro_batch=4, checkpoint_dir=str(tmp_path / "m4")), four, tokenizer)
    for name, parameter in swiftkv_parameters(one).items():
        assert torch.allclose(parameter, swiftkv_parameters(four)[name], atol=1e-5), name
