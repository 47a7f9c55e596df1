"""The prefill FLOP count (`flops.prefill_layers_flops`, behind `prefill_flops_per_token`, the bench's bound and
`prefill_compute_saving`) against torch's own op count around real prefills of tiny models: transformers' plain
teacher, and the HF SwiftKV student with its prefill skip (`logits_to_keep=1`: the later layers run on the last
row only). Dense and Mixture-of-Experts families, and DeepSeek's latent attention (both query layouts, a dense
first layer, shared experts); the experts run through transformers' default `grouped_mm`
kernel, counted by the distillation test's formula for it (`GROUPED_MM`). Attention runs on SDPA's math kernel,
which computes every key of every query: the count is taken at `keys = prompt length` here, where the bench
takes the causal average."""

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from swiftkv.flops import (
    attention_flops,
    layer_linear_flops,
    prefill_compute_saving,
    prefill_flops_per_token,
    prefill_layers_flops,
)
from swiftkv.model.config import is_swiftkv
from tests.test_distill_flops import GROUPED_MM
from tests.tiny import MLA_ARCHS, MOE_ARCHS, random_student

PROMPT = 48
N = 3


def executed_prefill(model, swiftkv: bool | None = None) -> int:
    """FlopCounterMode's FLOPs of one PROMPT-token prefill that wants the last row's logits."""
    ids = torch.randint(3, 100, (1, PROMPT), generator=torch.Generator().manual_seed(0))
    options = {} if swiftkv is None else {"swiftkv": swiftkv}
    with (
        torch.no_grad(),
        sdpa_kernel(SDPBackend.MATH),
        FlopCounterMode(display=False, custom_mapping=GROUPED_MM) as counter,
    ):
        model(ids, logits_to_keep=1, **options)
    return counter.get_total_flops()


def one_row(config) -> float:
    """What the count leaves out: the lm_head on the last row, and for a student that row's later layers."""
    head = 2 * config.hidden_size * config.vocab_size
    later = range(config.num_key_value_layers, config.num_hidden_layers) if is_swiftkv(config) else ()
    return head + sum(
        sum(layer_linear_flops(config, i).values())
        - layer_linear_flops(config, i)["kv"]
        + attention_flops(config, PROMPT)
        for i in later
    )


@pytest.mark.parametrize("arch", ["llama", "qwen3", *MOE_ARCHS, *MLA_ARCHS])
def test_the_prefill_count_is_what_the_teacher_and_the_student_execute(arch):
    teacher, student = random_student(arch, N)
    for model in (teacher, student):
        config = model.config
        counted = PROMPT * prefill_layers_flops(config, PROMPT) + one_row(config)
        assert counted == pytest.approx(executed_prefill(model), rel=1e-9), (arch, type(model).__name__)


def test_the_student_path_off_executes_the_teachers_count():
    """The SwiftKV model's teacher path runs what its plain teacher's count says."""
    teacher, student = random_student("qwen2_moe", N)
    counted = PROMPT * prefill_layers_flops(teacher.config, PROMPT) + one_row(teacher.config)
    assert counted == pytest.approx(executed_prefill(student, swiftkv=False), rel=1e-9)


def qwen3_30b_a3b_shape(**changes):
    """Qwen3-30B-A3B's config (48 layers, 128 experts, 8 per token, experts 768 wide, head_dim 128)."""
    from transformers import Qwen3MoeConfig

    shape = dict(
        vocab_size=151936,
        hidden_size=2048,
        intermediate_size=6144,
        moe_intermediate_size=768,
        num_hidden_layers=48,
        num_attention_heads=32,
        num_key_value_heads=4,
        head_dim=128,
        num_experts=128,
        num_experts_per_tok=8,
    )
    return Qwen3MoeConfig(**{**shape, **changes})


def test_the_count_at_the_qwen3_30b_a3b_shape():
    """Per layer: q 16.8M, k/v 4.2M, o 16.8M, router 0.5M, 8 experts of 9.4M: 113.5M, times 48, plus attention
    (2000-token prompts: 1000.5 keys on average). Its 8 x 768 experts equal its dense `intermediate_size` (6144),
    so the dense count it replaced differed by the router only (0.46%)."""
    config = qwen3_30b_a3b_shape()
    per_layer = 2 * 2048 * (4096 + 2 * 512 + 4096) + 2 * 2048 * 128 + 8 * 2 * 3 * 2048 * 768
    assert layer_linear_flops(config, 0)["mlp"] == 2 * 2048 * 128 + 75_497_472
    assert prefill_flops_per_token(config, 2000) == pytest.approx(48 * (per_layer + 4 * 32 * 128 * 1000.5))


def test_a_moe_students_saving_counts_its_experts():
    """At N = L/2 the student skips the later layers' attention projections, routers and experts: its linear
    saving is half, less the K/V each later layer's group still computes (G = 1)."""
    from swiftkv.model.surgery import swiftkv_config

    saving = prefill_compute_saving(swiftkv_config(qwen3_30b_a3b_shape(num_hidden_layers=16), 8, 1))
    kv_share = 2 * 2 * 2048 * 512 / (2 * 2048 * (4096 + 2 * 512 + 4096) + 2 * 2048 * 128 + 75_497_472)
    assert saving == pytest.approx(0.5 - kv_share / 2)
