"""`swiftkv distill SRC --plan`: memory per process from a config alone (meta device)."""

import json
import shutil

from swiftkv.cli import main
from swiftkv.distill.trainable import install
from swiftkv.sources import load_model
from tests.tiny import save_tiny_folder


def test_plan_needs_only_the_config_and_shards_what_fsdp_shards(tmp_path, capsys):
    folder = save_tiny_folder(tmp_path / "student")
    config_only = tmp_path / "config-only"
    config_only.mkdir()
    shutil.copy(folder / "config.json", config_only / "config.json")
    args = [
        "distill",
        str(config_only),
        "--plan",
        "--world-size",
        "4",
        "--seq-len",
        "64",
        "--micro-batch",
        "2",
        "--dtype",
        "float32",
        "--json",
        str(tmp_path / "plan.json"),
    ]
    assert main(args) == 0
    assert "fsdp x 4" in capsys.readouterr().out
    ddp, fsdp = json.loads((tmp_path / "plan.json").read_text())
    assert (ddp["mode"], fsdp["mode"]) == ("ddp", "fsdp")
    for part in ("weights", "trained", "optimizer"):
        assert abs(fsdp[part] * 4 - ddp[part]) < 1e-9, part
    assert ddp["gradients"] == 2 * ddp["trained"] and fsdp["gathered"] > 0 == ddp["gathered"]  # DDP's buckets
    assert ddp["activations"] == fsdp["activations"] > 0
    # 4 bytes per fp32 frozen weight: the tiny model's frozen parameters, counted on the meta device
    assert abs(ddp["weights"] * 2**30 - 4 * frozen_parameters(folder)) < 1
    assert main(args[:-2] + ["--micro-batch", "auto"]) == 2
    assert "--plan needs a number for --micro-batch" in capsys.readouterr().err


def frozen_parameters(folder) -> int:
    model = load_model(folder)
    install(model, "swiftkv")
    return sum(p.numel() for p in model.parameters() if not p.requires_grad)


def test_tensor_bytes_counts_the_storages_made_inside_it_until_they_are_freed():
    import torch

    from swiftkv.distill.memory import TensorBytes

    weight = torch.randn(1024, 1024, requires_grad=True)  # made before: not counted
    with TensorBytes() as counted:
        x = torch.randn(256, 1024)  # 1 MiB
        y = (x @ weight).relu()  # the product and its relu, 1 MiB each
        view = y[:10]  # a view: no new storage
        y.sum().backward()  # the weight's gradient, 4 MiB
        del x, y, view
    # x + product + relu + gradient alive as the backward ends (7 MiB), plus at most relu's 1 MiB backward
    # output, depending on when autograd frees it; never the weight made before
    assert 7.0 <= counted.peak_mib <= 8.0
    assert counted.current == 4 * 2**20  # the gradient outlives the block
