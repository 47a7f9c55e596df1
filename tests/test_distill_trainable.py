"""Student-only trainable sets (`--trainable lora|late|late-norms`): the teacher path stays exact, the
written folder holds the student's merged weights under the original names and says it lost its teacher."""

import copy
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from swiftkv.distill.core.checkpoint import trained_parameters
from swiftkv.distill.core.trainable import install, max_lora_rank, student_weights
from swiftkv.distill.core.trainer import (
    BatchSizes,
    SharedPrefixDistiller,
    cast_frozen,
    optimizer_for,
    train_step,
)
from swiftkv.distill.parallel.world import World
from swiftkv.distill.run import distill, run_distillation
from swiftkv.distill.settings import DistillSettings, settings_for
from swiftkv.model.surgery import load_trained, student_deltas
from tests.test_distill_train import blocks_for, run_settings
from tests.tiny import random_chats, save_tiny_folder, tiny_student, tiny_tokenizer, write_jsonl

STUDENT_ONLY = ("lora", "late", "late-norms")


def pair_of(model, blocks):
    rows = blocks.loss_mask.reshape(-1).nonzero().squeeze(1)
    with torch.no_grad():
        return SharedPrefixDistiller(model)(blocks.input_ids, blocks.position_ids, rows)


def prepared(model, trainable):
    """(settings, optimizer) of a one-step run; installs the trainable set."""
    settings = DistillSettings.of(
        source="tiny",
        trainable=trainable,
        lora_rank=4 if trainable == "lora" else None,
        batch_size=2,
        micro_batch=1,
        lr=1e-2,
        late_lr=1e-2,
        dtype="float32",
    )
    install(model, settings.model.trainable, settings.model.lora_rank)
    return settings, optimizer_for(model, settings.optim)


def one_step(model, blocks, settings, optimizer):
    train_step(
        SharedPrefixDistiller(model),
        model,
        optimizer,
        blocks,
        BatchSizes.of(blocks),
        settings.step_settings(),
        World(),
    )


@pytest.mark.parametrize("trainable", STUDENT_ONLY)
def test_student_only_weights_start_as_the_teachers_and_never_move_the_teacher_path(trainable):
    torch.manual_seed(0)
    model = tiny_student()
    blocks = blocks_for(model)
    before = pair_of(model, blocks)
    run = prepared(model, trainable)
    installed = pair_of(model, blocks)
    assert torch.equal(installed.teacher, before.teacher)
    assert (installed.student - before.student).abs().max().item() < 1e-6  # B = 0 / exact copies
    one_step(model, blocks, *run)
    after = pair_of(model, blocks)
    assert torch.equal(after.teacher, before.teacher)  # the frozen originals serve the teacher path
    assert (after.student - before.student).abs().max().item() > 1e-3  # and the student's own versions moved


def test_each_set_trains_exactly_its_weights():
    sizes = {}
    for trainable in ("swiftkv", *STUDENT_ONLY):
        model = tiny_student()
        names = set(install(model, trainable, 4 if trainable == "lora" else None))
        assert names == set(trained_parameters(model))
        sizes[trainable] = sum(p.numel() for n, p in model.named_parameters() if n in names)
        late = {n for n in names if "swiftkv" not in n}
        layers = {int(n.split(".")[2]) for n in late}
        assert layers <= {3, 4, 5}, late  # later layers only (N = 3 of 6)
    # hidden 64, intermediate 128, 3 later layers: o_proj + gate/up/down adapters of rank 4, or full copies
    lora = 3 * 4 * ((64 + 64) + 2 * (64 + 128) + (128 + 64))
    full = 3 * (64 * 64 + 3 * 64 * 128)
    assert sizes["lora"] - sizes["swiftkv"] == lora
    assert sizes["late"] - sizes["swiftkv"] == full
    assert sizes["late-norms"] - sizes["late"] == 3 * 2 * 64


def test_adamw_runs_fused_and_updates_as_the_per_tensor_loop_does():
    """The fused kernel is a speed path (a GPU step of a small student is bound by its launches), so
    its steps must be the per-tensor loop's: the same trained weights within fp32 rounding."""
    trained = {}
    for fused in (True, False):
        torch.manual_seed(0)
        model = tiny_student()
        blocks = blocks_for(model)
        settings, optimizer = prepared(model, "lora")
        assert all(group["fused"] for group in optimizer.param_groups)
        if not fused:
            for group in optimizer.param_groups:
                group["fused"], group["foreach"] = False, False
        start = {n: p.detach().clone() for n, p in trained_parameters(model).items()}
        for _ in range(3):
            one_step(model, blocks, settings, optimizer)
        trained[fused] = {n: p.detach().clone() for n, p in trained_parameters(model).items()}
        assert all(not torch.equal(trained[fused][n], start[n]) for n in start)
    for name, weight in trained[True].items():
        torch.testing.assert_close(weight, trained[False][name], rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("trainable", STUDENT_ONLY)
def test_merged_weights_reproduce_the_trained_student(trainable):
    torch.manual_seed(1)
    model = tiny_student()
    source = copy.deepcopy(model)
    blocks = blocks_for(model)
    one_step(model, blocks, *prepared(model, trainable))
    merged = student_weights(trained_parameters(model), source.state_dict())
    load_trained(source, {n: p for n, p in trained_parameters(model).items() if "swiftkv" in n})
    load_trained(source, merged, dict(source.named_parameters()))
    trained = pair_of(model, blocks).student
    plain = pair_of(source, blocks).student
    assert (trained - plain).abs().max().item() < 1e-5


def test_a_bf16_run_merges_its_adapters_onto_the_source_weights_at_the_adapters_rank():
    # A bf16 run casts the frozen weights for compute; merging onto that copy made the folder differ from
    # the source at full rank (bf16 rounding), and the rank-4 export refused it (2026-11-26, N = 22).
    torch.manual_seed(3)
    model = tiny_student()
    source = copy.deepcopy(model)  # the unwrapped source, in fp32
    install(model, "lora", 4)
    for name, parameter in model.named_parameters():
        if name.endswith("lora_b"):
            torch.nn.init.normal_(parameter, std=0.02)  # a trained adapter: B is no longer zero
    cast_frozen(model, torch.bfloat16)
    student = copy.deepcopy(source)
    load_trained(
        student,
        student_weights(trained_parameters(model), source.state_dict()),
        dict(student.named_parameters()),
    )
    student.config.swiftkv_student_trained = ["self_attn.o_proj", "mlp"]
    factors = student_deltas(student, source, 4)
    assert len(factors) == 2 * 3 * 4  # o_proj, gate/up/down of layers 3-5, two factors each


def test_rank_out_of_range_and_a_rank_without_lora_are_refused():
    model = tiny_student()
    high = max_lora_rank(model.config)
    assert high == 64
    for rank in (0, -1, high + 1):
        with pytest.raises(ValueError, match=f"expected 1 <= rank <= {high}"):
            install(tiny_student(), "lora", rank)
    with pytest.raises(ValueError, match="applies to --trainable lora only"):
        install(model, "late", 8)
    install(model, "late")
    with pytest.raises(ValueError, match="already installed"):
        install(model, "lora", 4)


def test_resume_with_another_trainable_set_is_refused(tmp_path):
    tokenizer = tiny_tokenizer()
    distill(run_settings(tmp_path, stop_after=1, trainable="late"), tiny_student(), tokenizer)
    with pytest.raises(ValueError, match="trainable: checkpoint 'late' vs now 'lora'"):
        distill(run_settings(tmp_path, resume=True, trainable="lora"), tiny_student(), tokenizer)


def distilled_folder(tmp_path, trainable: str):
    source = save_tiny_folder(tmp_path / "src")
    write_jsonl(tmp_path / "chats.jsonl", random_chats(40, seed=3))
    run_distillation(student_settings(tmp_path, source, trainable, out=str(tmp_path / "out")))
    return source, tmp_path / "out"


def student_settings(tmp_path, source, trainable: str, **overrides) -> DistillSettings:
    """A short run of `trainable` on `tmp_path`'s chats, with `overrides`."""
    return settings_for(
        str(source),
        "reference",
        data=str(tmp_path / "chats.jsonl"),
        trainable=trainable,
        tokens=32 * 4 * 2,
        heldout_tokens=64,
        seq_len=32,
        batch_size=4,
        micro_batch=2,
        lr=1e-2,
        late_lr=1e-2,
        dtype="float32",
        mse_weight=0.0,
        **overrides,
    )


def test_a_folder_whose_later_layers_were_trained_says_so_and_refuses_its_teacher_path(tmp_path):
    from transformers import AutoModelForCausalLM

    from swiftkv.evaluate.pair import load_pair

    source, out = distilled_folder(tmp_path, "late")
    config = json.loads((out / "config.json").read_text())
    assert config["swiftkv_student_trained"] == ["self_attn.o_proj", "mlp"]
    model = AutoModelForCausalLM.from_pretrained(out)
    original = AutoModelForCausalLM.from_pretrained(source)
    # same weight names as the source (vLLM and the reference code load it), later MLPs changed
    assert set(model.state_dict()) == set(original.state_dict())
    assert not torch.equal(
        model.model.layers[4].mlp.up_proj.weight, original.model.layers[4].mlp.up_proj.weight
    )
    assert torch.equal(model.model.layers[1].mlp.up_proj.weight, original.model.layers[1].mlp.up_proj.weight)
    ids = torch.tensor([[5, 6, 7, 8]])
    with pytest.raises(ValueError, match="distilled for the student"):
        model.set_swiftkv(False)
    with pytest.raises(ValueError, match="cannot run its teacher path"):
        model(ids, swiftkv=False)
    with pytest.raises(ValueError, match="pass --teacher"):
        load_pair(str(out), None, torch.float32)
    pair = load_pair(str(out), str(source), torch.float32)
    assert pair.mode == "separate"  # never the student's own (gone) teacher path
    with pytest.raises(ValueError, match="cannot be distilled"):
        run_distillation(
            DistillSettings.of(
                source=str(out), out=str(tmp_path / "again"), init="keep", targets="human", dtype="float32"
            )
        )


def test_a_lora_student_ships_as_rank_factors_that_rebuild_it(tmp_path):
    """The trained-tensor folder of a `--trainable lora` student holds its SwiftKV parameters and the
    rank-r factors of its later layers' difference from the base: the rebuilt folder is the student
    (logits to fp32 noise) and says its later layers were trained; whole copies are refused."""
    from swiftkv.model.surgery import read_trained, save_swiftkv_params
    from swiftkv.replies import save_plain_teacher
    from swiftkv.sources import load_model, resolve_source

    source, out = distilled_folder(tmp_path, "lora")
    save_plain_teacher(source, tmp_path / "base")  # what a shipped student names: the plain model
    student, base = load_model(out), load_model(tmp_path / "base")
    save_swiftkv_params(
        student,
        tmp_path / "w",
        base=str(tmp_path / "base"),
        dtype=torch.float32,
        base_model=base,
        student_rank=16,
    )
    spec, tensors = read_trained(tmp_path / "w")
    assert spec["student_trained"] == ["self_attn.o_proj", "mlp"] and spec["student_rank"] == 16
    assert any(k.endswith(".mlp.down_proj.weight.delta_a") for k in tensors)
    rebuilt = load_model(resolve_source(tmp_path / "w"))
    assert rebuilt.config.swiftkv_student_trained == ["self_attn.o_proj", "mlp"]
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    with torch.no_grad():
        assert float((rebuilt(ids).logits - student(ids).logits).abs().max()) < 1e-4
    with pytest.raises(ValueError, match="pass base_model and student_rank"):
        save_swiftkv_params(student, tmp_path / "x", base=str(tmp_path / "base"))
    _, late = distilled_folder(tmp_path / "late", "late")
    with pytest.raises(ValueError, match="by more than rank 16"):
        save_swiftkv_params(
            load_model(late), tmp_path / "y", base=str(tmp_path / "base"), base_model=base, student_rank=16
        )


def test_init_from_a_lora_students_weights_starts_where_that_student_ended(tmp_path):
    """--init-from a student's weights folder (as students ship): its SwiftKV parameters, and its rank
    factors as the adapters' factors, so the run's step-0 held-out score is the one that student ended
    on (to fp32 noise of how its factors were split); it then trains on. Another N or rank is refused
    before any work, and a folder short of a trained tensor is refused by name."""
    from swiftkv.model.surgery import save_swiftkv_params
    from swiftkv.replies import save_plain_teacher
    from swiftkv.sources import load_model

    source = save_tiny_folder(tmp_path / "src")
    write_jsonl(tmp_path / "chats.jsonl", random_chats(40, seed=3))
    out = tmp_path / "out"
    ended = run_distillation(student_settings(tmp_path, source, "lora", out=str(out))).summary[
        "heldout_after"
    ]
    save_plain_teacher(source, tmp_path / "base")
    student, base = load_model(out), load_model(tmp_path / "base")
    save_swiftkv_params(
        student, tmp_path / "w", base=str(source), dtype=torch.float32, base_model=base, student_rank=16
    )
    again = student_settings(
        tmp_path, source, "lora", out=str(tmp_path / "again"), init_from=str(tmp_path / "w")
    )
    summary = run_distillation(again).summary
    assert summary["heldout_before"]["kl"] == pytest.approx(ended["kl"], rel=1e-4, abs=1e-6)
    assert summary["heldout_after"]["kl"] != summary["heldout_before"]["kl"]
    with pytest.raises(ValueError, match=r"another student .*student_rank: folder 16 vs this run 8"):
        run_distillation(again.but(lora_rank=8, out=str(tmp_path / "r8")))
    with pytest.raises(ValueError, match=r"another student .*student_trained: folder .* vs this run None"):
        run_distillation(again.but(trainable="swiftkv", out=str(tmp_path / "sk")))
    assert not (tmp_path / "r8").exists() and not (tmp_path / "sk").exists()
    short = tmp_path / "short"
    short.mkdir()
    (short / "swiftkv.json").write_text((tmp_path / "w" / "swiftkv.json").read_text())
    tensors = load_file(tmp_path / "w" / "swiftkv.safetensors")
    save_file(
        {k: v for k, v in tensors.items() if "layers.4.mlp.up_proj" not in k}, short / "swiftkv.safetensors"
    )
    with pytest.raises(ValueError, match=r"lacks trained tensors .*layers\.4\.mlp\.up_proj\.lora"):
        run_distillation(again.but(init_from=str(short), out=str(tmp_path / "s")))


def test_init_from_a_gpu_loans_snapshot_starts_where_that_student_ended(tmp_path):
    """--init-from a loan's student snapshot (OUT/n15/: bf16 tensors named as a run's trained parameters,
    the student in the first file's progress): the run starts where the snapshot's student ended, to
    bf16 rounding; a snapshot of another N, or one that does not name its teacher, is refused."""
    from swiftkv.distill.start.from_weights import weights_trained
    from swiftkv.distill.start.snapshot import write_snapshot
    from swiftkv.model.surgery import save_swiftkv_params
    from swiftkv.replies import save_plain_teacher
    from swiftkv.sources import load_model

    source = save_tiny_folder(tmp_path / "src")
    write_jsonl(tmp_path / "chats.jsonl", random_chats(40, seed=3))
    out = tmp_path / "out"
    settings = student_settings(tmp_path, source, "lora", out=str(out))
    result = run_distillation(settings).summary
    save_plain_teacher(source, tmp_path / "base")
    student = load_model(out)
    save_swiftkv_params(
        student,
        tmp_path / "w",
        base=str(source),
        dtype=torch.float32,
        base_model=load_model(tmp_path / "base"),
        student_rank=16,
    )
    progress = {
        "teacher": "/root/sk/work/teacher.gguf",  # the box's path: not here
        "teacher_digest": "ab12",
        "teacher_name": str(source),
        "num_key_value_layers": student.config.num_key_value_layers,
        "key_value_group_size": 1,
        "trainable": "lora",
        "lora_rank": 16,
    }
    write_snapshot(tmp_path / "n", weights_trained(tmp_path / "w"), progress)
    again = run_distillation(settings.but(init_from=str(tmp_path / "n"), out=str(tmp_path / "again")))
    before = again.summary["heldout_before"]["kl"]
    assert before == pytest.approx(result["heldout_after"]["kl"], rel=0.05)
    assert before != pytest.approx(result["heldout_before"]["kl"], rel=0.2)  # not the fresh student's start
    for changed, message in (
        ({"num_key_value_layers": 2}, "num_key_value_layers: folder 2"),
        ({"teacher_name": None}, "base: folder None"),
    ):
        write_snapshot(tmp_path / "m", weights_trained(tmp_path / "w"), {**progress, **changed})
        with pytest.raises(ValueError, match=f"another student .*{message}"):
            run_distillation(settings.but(init_from=str(tmp_path / "m"), out=str(tmp_path / "x")))


def test_adapters_start_from_the_run_seed_not_the_process_random_state():
    """Every process of a sharded run initialises its own copy, and two runs of the same settings must
    start alike: the adapters' A factors come from the run's seed alone."""
    factors = []
    for process_seed, run_seed in ((1, 0), (2, 0), (1, 5)):
        torch.manual_seed(process_seed)
        trained = install(tiny_student(), "lora", 4, seed=run_seed)
        factors.append(torch.cat([p.flatten() for n, p in trained.items() if n.endswith("lora_a")]))
    assert torch.equal(factors[0], factors[1]) and not torch.equal(factors[0], factors[2])
