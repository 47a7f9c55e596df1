"""The FLOP count of a distillation step (`flops.distill_flops_per_token`, through `bound.step_flops_per_token`)
against torch's own op count (`torch.utils.flop_counter.FlopCounterMode`) around real steps of the trainer on
tiny models: every recipe and path the count models, on the dense and the Mixture-of-Experts families. The count
published before 2026-12-01 charged the student's later layers for every position; on blocks with few trained
positions it misses by far. Until 2026-12-02 it charged an MoE layer one dense MLP at `intermediate_size`.

The MoE experts run through transformers' default `grouped_mm` kernel (`aten._grouped_mm`), for which torch's
op counter has no formula (it counts it as nothing): `GROUPED_MM` gives it one, the multiply-adds of the rows
the kernel multiplies, and `test_the_grouped_mm_formula_counts_what_the_per_expert_loop_runs` checks it against
transformers' per-expert loop (plain matmuls, which the counter counts itself)."""

import copy
import math

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from swiftkv.data.packing import Blocks
from swiftkv.distill.core.loss import BatchSizes
from swiftkv.distill.core.trainer import prepare, rank_blocks, train_step
from swiftkv.distill.measure.bound import micro_batches, step_flops_per_token, step_paths
from swiftkv.distill.parallel.world import World
from swiftkv.distill.settings import settings_for
from swiftkv.flops import attention_flops, distill_flops_per_token, layer_linear_flops
from swiftkv.model.modeling import student_selection
from swiftkv.peaks import nominal_peak
from tests.tiny import MLA_ARCHS, MOE_ARCHS, tiny_student

aten = torch.ops.aten

SEQ_LEN = 64
BLOCKS = 4  # two steps of two blocks


def human_mask() -> torch.Tensor:
    """Human answers: long trained stretches, one block with none (its micro-batch runs one stand-in row)."""
    mask = torch.zeros(BLOCKS, SEQ_LEN, dtype=torch.bool)
    mask[0, 20:60] = True
    mask[1, 5:40] = True
    mask[3, 10:63] = True
    return mask


def reply_mask() -> torch.Tensor:
    """Teacher replies: a few trained positions at the end of each block, as 64-token replies after a
    whole conversation."""
    mask = torch.zeros(BLOCKS, SEQ_LEN, dtype=torch.bool)
    for block, start in enumerate((56, 58, 60, 57)):
        mask[block, start : start + 3] = True
    return mask


def grouped_mm_flops(a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    """FLOPs of `aten._grouped_mm`: 2 x the multiply-adds of the rows it multiplies. The forward and the input
    gradient ([rows, k] @ [experts, k, n]) multiply every routed row once by its expert; the weight gradient
    ([k, rows] @ [rows, n] -> [experts, k, n]) splits the rows among the experts."""
    if len(a_shape) == 2 and len(b_shape) == 2:
        return 2 * a_shape[0] * a_shape[1] * b_shape[1]
    return 2 * math.prod(out_shape) * a_shape[-1]


GROUPED_MM = {aten._grouped_mm: grouped_mm_flops}


def counted_and_executed(
    mask: torch.Tensor, g: int = 1, recipe: str = "swiftkv", arch: str = "llama", **given
) -> tuple:
    """(the count's FLOPs, FlopCounterMode's) over two real train steps of `recipe` on tiny random blocks.
    Attention runs on SDPA's math kernel: it is matmuls the op counter counts, where the CPU's fused kernel
    has no formula in it (counted as nothing)."""
    model = tiny_student(2 if g == 2 else 3, g=g, arch=arch)
    ids = torch.randint(3, 100, (BLOCKS, SEQ_LEN), generator=torch.Generator().manual_seed(0))
    train = Blocks(ids, torch.arange(SEQ_LEN).repeat(BLOCKS, 1), mask)
    settings = settings_for(
        "tiny", recipe, **{"seq_len": SEQ_LEN, "batch_size": 2, "micro_batch": 1, "dtype": "float32", **given}
    )
    world = World(device=torch.device("cpu"))
    distiller, optimizer, step, _ = prepare(settings, model, train, world)
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False, custom_mapping=GROUPED_MM) as counter:
        for index in range(BLOCKS // settings.optim.batch_size):
            blocks = rank_blocks(train, index, settings.optim.batch_size, world)
            train_step(distiller, model, optimizer, blocks, BatchSizes.of(blocks), step, world)
    counted = step_flops_per_token(model.config, settings, train, step.micro_batch) * train.num_tokens
    return counted, counter.get_total_flops(), model.config


CASES = {
    "default recipe": (human_mask, {}),
    "reference recipe (MSE probe)": (human_mask, {"recipe": "reference", "batch_size": 2}),
    "lora recipe": (human_mask, {"recipe": "swiftkv-lora"}),
    "AcrossKV G = 2": (human_mask, {"g": 2}),
    "micro-batch 2": (human_mask, {"micro_batch": 2}),
    "teacher replies, few trained positions": (reply_mask, {}),
    "teacher replies, micro-batch 2": (reply_mask, {"micro_batch": 2}),
    "late-norms copies": (human_mask, {"trainable": "late-norms"}),
    "naive": (human_mask, {"naive": True}),
    "activation checkpointing, lora": (
        human_mask,
        {"recipe": "swiftkv-lora", "activation_checkpointing": True},
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_the_count_is_what_the_trainer_executes(case):
    mask, given = CASES[case]
    counted, executed, _ = counted_and_executed(mask(), **given)
    assert executed > 0
    assert abs(counted / executed - 1) < 0.03, (case, counted, executed)


# The MoE families train only the SwiftKV parameters (routers and experts frozen; lora and late copies are refused
# for them). Their tiny students hold both MLP kinds: Qwen3-MoE's layer 1, Qwen2-MoE's layer 4 and DeepSeek's layer 0
# are dense.
MOE_CASES = {
    "default recipe": (human_mask, {}),
    "reference recipe (MSE probe)": (human_mask, {"recipe": "reference", "batch_size": 2}),
    "AcrossKV G = 2": (human_mask, {"g": 2}),
    "teacher replies, micro-batch 2": (reply_mask, {"micro_batch": 2}),
    "naive": (human_mask, {"naive": True}),
    "activation checkpointing": (human_mask, {"activation_checkpointing": True}),
}


@pytest.mark.parametrize("arch", (*MOE_ARCHS, *MLA_ARCHS))
@pytest.mark.parametrize("case", MOE_CASES)
def test_the_moe_count_is_what_the_trainer_executes(arch, case):
    """Per routed token: the router, top-k experts and Qwen2-MoE's shared expert and gate, DeepSeek's shared
    experts (`metrics.mlp_flops`); DeepSeek's latent attention (`model.mla.LATENT_ATTENTION`): the query
    without and with q_lora_rank, each group's latent decompressed once for every token.
    Equal to the FLOP: the router is ~1% of an expert here and the shared gate less, so a 3% tolerance could not
    tell a count that leaves them out."""
    mask, given = MOE_CASES[case]
    counted, executed, _ = counted_and_executed(mask(), arch=arch, **given)
    assert counted == pytest.approx(executed, rel=1e-9), (arch, case, counted, executed)


def forward_backward_flops(arch: str, experts_implementation: str) -> dict:
    """FlopCounterMode's counts by op of one forward and backward of every weight of a tiny MoE teacher."""
    model = tiny_student(3, arch=arch)
    model.set_experts_implementation(experts_implementation)
    ids = torch.randint(3, 100, (2, SEQ_LEN), generator=torch.Generator().manual_seed(0))
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False, custom_mapping=GROUPED_MM) as counter:
        model(ids, swiftkv=False).logits.sum().backward()
    return {str(op): flops for op, flops in counter.get_flop_counts()["Global"].items()}


@pytest.mark.parametrize("arch", MOE_ARCHS)
def test_the_grouped_mm_formula_counts_what_the_per_expert_loop_runs(arch):
    """The same weights and tokens through transformers' `grouped_mm` experts and its eager per-expert loop: the
    grouped kernel's FLOPs (`grouped_mm_flops`) are exactly what the loop's matmuls add, weight gradients too."""
    grouped, loop = forward_backward_flops(arch, "grouped_mm"), forward_backward_flops(arch, "eager")
    assert grouped["aten._grouped_mm"] > 0 and "aten._grouped_mm" not in loop
    assert sum(grouped.values()) == sum(loop.values())


def dense_mlp_count(config, micro_batches, paths) -> float:
    """The count published until 2026-12-02 on an MoE config: every MLP dense at `intermediate_size`."""
    dense = copy.deepcopy(config)
    dense.num_experts = 0  # Mixtral's alias of num_local_experts
    return distill_flops_per_token(dense, micro_batches, paths)


@pytest.mark.parametrize("arch", ["qwen2_moe", "mixtral"])
def test_a_dense_mlp_count_misses_the_moe_step(arch):
    """Mixtral's experts are `intermediate_size` wide and two run per token; Qwen2-MoE adds a shared expert: a
    dense MLP at `intermediate_size` misses the executed step by more than a tenth."""
    mask = human_mask()
    counted, executed, config = counted_and_executed(mask, arch=arch)
    settings = settings_for("tiny", "swiftkv", seq_len=SEQ_LEN, batch_size=2, micro_batch=1)
    old = dense_mlp_count(config, micro_batches(mask, 1, probe=False), step_paths(settings)) * mask.numel()
    assert abs(counted / executed - 1) < 0.03
    assert abs(old / executed - 1) > 0.10, (old, executed)


def old_flops_per_token(config, seq_len: int, target_fraction: float) -> float:
    """The count published until 2026-12-01: the student's later layers on every position, causal attention
    over (seq_len + 1) / 2 keys, no adapters or probe."""
    flops = layer_linear_flops(config, 0)  # a dense model: every layer alike
    n, later, groups = (
        config.num_key_value_layers,
        config.num_hidden_layers - config.num_key_value_layers,
        config.num_kv_groups,
    )
    attention = attention_flops(config, (seq_len + 1) / 2)
    full_layer = sum(flops.values()) + attention
    student_linear = later * (flops["q"] + flops["o"] + flops["mlp"]) + groups * flops["kv"]
    student = 2 * student_linear + 3 * later * attention + later * flops["q"] + groups * flops["kv"]
    head = 2 * config.hidden_size * config.vocab_size * target_fraction
    return n * full_layer + later * full_layer + student + 3 * head


def test_the_old_count_missed_by_more_than_a_tenth_on_few_trained_positions():
    mask = reply_mask()
    counted, executed, config = counted_and_executed(mask)
    old = old_flops_per_token(config, SEQ_LEN, float(mask.float().mean())) * mask.numel()
    assert abs(counted / executed - 1) < 0.03
    assert old / executed - 1 > 0.10, (old, executed)


def test_the_positions_are_the_ones_the_model_selects():
    """The count's positions per micro-batch are `student_selection`'s, from the rows `on_device` finds."""
    mask = torch.rand(8, SEQ_LEN, generator=torch.Generator().manual_seed(1)) < 0.1
    mask[5] = False
    for micro in micro_batches(mask, 2, probe=False):
        assert micro.blocks == 2
    for start, micro in zip(range(0, 8, 2), micro_batches(mask, 2, probe=False), strict=True):
        rows = mask[start : start + 2].reshape(-1).nonzero().squeeze(1)
        rows = rows if len(rows) else rows.new_zeros(1)
        positions, _ = student_selection(rows, SEQ_LEN, may_skip=True)
        assert (micro.positions, micro.rows) == (len(positions), len(rows))
    assert {m.positions for m in micro_batches(mask, 2, probe=True)} == {SEQ_LEN}


def test_nominal_peaks_by_device_name():
    assert nominal_peak("NVIDIA H100 80GB HBM3") == nominal_peak("NVIDIA H200") == 989e12
    assert nominal_peak("NVIDIA H100 PCIe") == 756e12 and nominal_peak("NVIDIA A100-SXM4-80GB") == 312e12
    assert nominal_peak("NVIDIA L40S") == 362e12 and nominal_peak("NVIDIA B200") == 2250e12
    assert nominal_peak("cpu") is None and nominal_peak("NVIDIA GeForce RTX 4090") is None


def test_the_published_8b_shape_figure_restated():
    """The H200 loan's Llama-3.1-8B-shape step (2026-11-27: seq 4096, 4 blocks per forward, the last quarter of
    each block trained, 21,262.8 tok/s against a measured 753.3 TFLOP/s bf16 peak): the old count reproduces the
    recorded 32,194,839,040 FLOPs per token (90.9%); as executed it is 62.0% of that peak and 47.3% MFU."""
    from transformers import LlamaConfig

    from swiftkv.distill.measure.bound import bound_line, bound_of, devices_bound
    from swiftkv.model.surgery import swiftkv_config

    shape = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32)
    config = swiftkv_config(LlamaConfig(**shape, num_attention_heads=32, num_key_value_heads=8), 16, 1)
    mask = torch.zeros(8, 4096, dtype=torch.bool)
    mask[:, 3072:-1] = True  # 1,023 trained positions a block
    blocks = Blocks(torch.zeros(8, 4096, dtype=torch.long), torch.arange(4096).repeat(8, 1), mask)
    settings = settings_for("random", "swiftkv", seq_len=4096, batch_size=4)
    assert round(old_flops_per_token(config, 4096, float(mask.float().mean()))) == 32_194_839_040
    flops = step_flops_per_token(config, settings, blocks, 4)
    assert round(flops / 1e9, 2) == 21.98
    h200 = bound_of(flops, 21262.8, 753297054729709, nominal_peak("NVIDIA H200"), "NVIDIA H200")
    assert (h200["fraction_of_bound"], h200["mfu"]) == (0.62, 0.473)
    assert "62.0% of the measured 753 TFLOP/s matmul peak, MFU 47.3% (the nominal 989 TFLOP/s" in bound_line(
        h200
    )
    cpu = devices_bound(flops, 21262.8, torch.bfloat16, torch.device("cpu"), peak=753297054729709)
    assert cpu["fraction_of_bound"] == 0.62 and cpu["mfu"] is None and "MFU n/a" in bound_line(cpu)
