"""scripts/study/distill/soup.py: the mean of students' trained-tensor folders (the SwiftKV tensors averaged, each
adapted weight's change averaged exactly as stacked factors), its refusal of students of another geometry,
and `--rank`'s best low-rank approximation of that mean."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from swiftkv.model.surgery import read_trained

SOUP = Path(__file__).parents[1] / "scripts" / "study" / "distill" / "soup.py"
WEIGHT = "model.layers.2.mlp.up_proj.weight"
OWN = "model.layers.2.self_attn.q_proj_swiftkv.weight"


def load_soup():
    spec = importlib.util.spec_from_file_location("soup", SOUP)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def student(folder: Path, seed: int, n: int = 2, rank: int = 4) -> dict[str, torch.Tensor]:
    """A trained-tensor folder as save_swiftkv_params writes one: a SwiftKV weight and one rank-`rank` change."""
    generator = torch.Generator().manual_seed(seed)
    tensors = {
        OWN: torch.randn(8, 8, generator=generator).bfloat16(),
        WEIGHT + ".delta_b": torch.randn(12, rank, generator=generator).bfloat16(),
        WEIGHT + ".delta_a": torch.randn(rank, 8, generator=generator).bfloat16(),
    }
    folder.mkdir()
    save_file(tensors, str(folder / "swiftkv.safetensors"))
    spec = {
        "base": "smollm2-135m-instruct",
        "num_key_value_layers": n,
        "key_value_group_size": 1,
        "student_trained": ["self_attn.o_proj", "mlp"],
        "student_rank": rank,
    }
    (folder / "swiftkv.json").write_text(json.dumps(spec))
    return tensors


def change(tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    return tensors[WEIGHT + ".delta_b"].double() @ tensors[WEIGHT + ".delta_a"].double()


def test_the_soup_holds_the_mean_of_the_students_changes_exactly(tmp_path):
    soup = load_soup()
    a, b = student(tmp_path / "a", 0), student(tmp_path / "b", 1)
    soup.main([str(tmp_path / "ab"), str(tmp_path / "a"), str(tmp_path / "b")])
    spec, tensors = read_trained(tmp_path / "ab")
    assert spec["student_rank"] == 8 and spec["num_key_value_layers"] == 2
    assert all(t.dtype == torch.bfloat16 for t in tensors.values())
    # the stacked factors halve delta_a, exact in bf16: the product is the mean to float64 rounding
    assert torch.allclose(change(tensors), (change(a) + change(b)) / 2, rtol=0, atol=1e-12)
    mean = ((a[OWN].float() + b[OWN].float()) / 2).bfloat16()
    assert torch.equal(tensors[OWN], mean)


def test_rank_keeps_the_best_approximation_of_the_mean_change(tmp_path, capsys):
    soup = load_soup()
    a, b = student(tmp_path / "a", 0), student(tmp_path / "b", 1)
    soup.main([str(tmp_path / "ab4"), str(tmp_path / "a"), str(tmp_path / "b"), "--rank", "4"])
    spec, tensors = read_trained(tmp_path / "ab4")
    assert spec["student_rank"] == 4 and tensors[WEIGHT + ".delta_b"].shape == (12, 4)
    mean = (change(a) + change(b)) / 2
    u, s, vh = torch.linalg.svd(mean)
    best = u[:, :4] @ torch.diag(s[:4]) @ vh[:4]
    # bf16 factors: within their rounding of the best rank-4 approximation, far from the mean itself
    assert (change(tensors) - best).norm() < 1e-2 * best.norm() < (mean - best).norm()
    assert "of a difference's norm left out" in capsys.readouterr().out


def test_left_out_measures_what_the_stored_factors_miss_of_the_exact_mean(tmp_path):
    """A soup's card states left_out: zero for a soup stored exactly, the norm share of the discarded singular
    values (to the factors' bf16 rounding) for one stored at a lower rank."""
    soup = load_soup()
    a, b = student(tmp_path / "a", 0), student(tmp_path / "b", 1)
    students = [tmp_path / "a", tmp_path / "b"]
    soup.main([str(tmp_path / "ab"), *map(str, students)])
    soup.main([str(tmp_path / "ab4"), *map(str, students), "--rank", "4"])
    assert soup.left_out(tmp_path / "ab", students) == 0.0
    s = torch.linalg.svdvals((change(a) + change(b)) / 2)
    discarded = float(s[4:].norm() / s.norm())
    assert discarded > 0.1 and soup.left_out(tmp_path / "ab4", students) == pytest.approx(discarded, abs=1e-2)


def test_weights_give_each_student_its_share(tmp_path):
    soup = load_soup()
    a, b = student(tmp_path / "a", 0), student(tmp_path / "b", 1)
    soup.main([str(tmp_path / "ab"), str(tmp_path / "a"), str(tmp_path / "b"), "--weights", "3,1"])
    _, tensors = read_trained(tmp_path / "ab")
    mean = 0.75 * change(a) + 0.25 * change(b)
    # 3/4 is not a power of two: one bf16 rounding of the first student's delta_a
    assert (change(tensors) - mean).norm() < 2**-8 * mean.norm()
    assert torch.equal(tensors[OWN], (0.75 * a[OWN].float() + 0.25 * b[OWN].float()).bfloat16())
    with pytest.raises(ValueError, match=r"--weights \[1.0\]: expected 2 nonzero weights"):
        soup.main([str(tmp_path / "x"), str(tmp_path / "a"), str(tmp_path / "b"), "--weights", "1"])
    for refused in ("1,0", "1,-1", "-2,1"):
        with pytest.raises(ValueError, match="with a positive sum"):
            soup.main([str(tmp_path / "x"), str(tmp_path / "a"), str(tmp_path / "b"), f"--weights={refused}"])
    assert not (tmp_path / "x").exists()


def test_a_negative_weight_extrapolates_past_the_first_student(tmp_path):
    soup = load_soup()
    a, b = student(tmp_path / "a", 0), student(tmp_path / "b", 1)
    soup.main([str(tmp_path / "ab"), str(tmp_path / "a"), str(tmp_path / "b"), "--weights", "3,-1"])
    _, tensors = read_trained(tmp_path / "ab")
    # a + (a - b) / 2: the shares 3/2 and -1/2 scale bf16 exactly (powers of two times small integers)
    beyond = 1.5 * change(a) - 0.5 * change(b)
    assert (change(tensors) - beyond).norm() < 2**-8 * beyond.norm()
    assert torch.equal(tensors[OWN], (1.5 * a[OWN].float() - 0.5 * b[OWN].float()).bfloat16())


def test_students_of_another_geometry_are_refused(tmp_path):
    soup = load_soup()
    student(tmp_path / "a", 0, n=2)
    student(tmp_path / "b", 1, n=3)
    with pytest.raises(ValueError, match=r"another student .*num_key_value_layers"):
        soup.main([str(tmp_path / "ab"), str(tmp_path / "a"), str(tmp_path / "b")])
    assert not (tmp_path / "ab").exists()


def test_a_loan_snapshot_is_read_as_the_trained_folder_it_installs_to(tmp_path):
    """A loan's student snapshot (adapter factors named as a run's parameters, the student in its progress) is
    read as `loan install` + `save_swiftkv_params` would save it: its SwiftKV tensors and, per adapted weight, a
    change equal to the adapter's own lora_b @ lora_a."""
    from swiftkv.distill.core.trainable import LORA_A, LORA_B, install
    from swiftkv.distill.start.snapshot import write_snapshot
    from swiftkv.model.surgery import build_swiftkv_model
    from swiftkv.sources import load_model
    from tests.tiny import save_tiny_teacher

    teacher = save_tiny_teacher(tmp_path / "teacher")
    student_model = build_swiftkv_model(load_model(teacher), 3, 1)
    trained = install(student_model, "lora", 4, seed=0)
    generator = torch.Generator().manual_seed(7)
    tensors = {name: torch.randn(p.shape, generator=generator).bfloat16() for name, p in trained.items()}
    progress = {"teacher": str(teacher), "num_key_value_layers": 3, "key_value_group_size": 1}
    write_snapshot(tmp_path / "n3", tensors, progress | {"trainable": "lora", "lora_rank": 4, "seed": 0})

    spec, read = load_soup().read_student(tmp_path / "n3")
    assert spec == {
        "base": str(teacher),
        "num_key_value_layers": 3,
        "key_value_group_size": 1,
        "student_trained": ["self_attn.o_proj", "mlp"],
        "student_rank": 4,
    }
    adapters = [name.removesuffix(LORA_B) for name in tensors if name.endswith(LORA_B)]
    assert adapters and len(read) == len(tensors)
    for path in adapters:
        own = tensors[path + LORA_B].double() @ tensors[path + LORA_A].double()
        stored = read[path + ".weight.delta_b"].double() @ read[path + ".weight.delta_a"].double()
        assert (stored - own).norm() < 2**-6 * own.norm()  # bf16 factors of an fp32 merge, split anew
    assert all(torch.equal(read[name], t) for name, t in tensors.items() if "swiftkv" in name)
