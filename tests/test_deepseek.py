"""DeepSeek-V2 and DeepSeek-V3 (multi-head latent attention, MoE) as SwiftKV families: the teacher path ==
transformers' own model, the student == an independent reference (tests/reference.py: MLA, YaRN, DeepSeek's
routing) at G = 1 and 2 with and without q_lora_rank, each group's latent (not per-layer K/V) in the cache
with decoding == the full forward, the KV bytes per token, ArcticTraining's tensor layout and init, convert,
distill with experts and routers frozen, eval and generate, and the vLLM refusal."""

from __future__ import annotations

import pytest
import torch

from swiftkv.cli import main
from tests import reference
from tests.tiny import (
    MLA_ARCHS,
    random_student,
)

LAYERS, N = 6, 2
# Both query layouts of each family: q_proj (q_lora_rank None, DeepSeek-V2-Lite) and q_a/q_b (DeepSeek-V2,
# V3); DeepSeek-V3 also with RoPE on halves (rope_interleave false).
LAYOUTS = {
    "deepseek_v2": {"q_proj": {"q_lora_rank": None}, "q_lora": {"q_lora_rank": 24}},
    "deepseek_v3": {
        "q_proj": {"q_lora_rank": None},
        "q_lora": {"q_lora_rank": 24},
        "q_lora_halves": {"q_lora_rank": 24, "rope_interleave": False},
    },
}
CASES = [(arch, layout) for arch in MLA_ARCHS for layout in LAYOUTS[arch]]


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max())


def ids(batch: int = 2, seq: int = 17) -> torch.Tensor:
    return torch.randint(3, 120, (batch, seq), generator=torch.Generator().manual_seed(batch * 100 + seq))


def cli(*args) -> int:
    return main([str(a) for a in args])


def student_of(arch: str, layout: str, g: int = 1, **kwargs):
    return random_student(arch, N, g, **LAYOUTS[arch][layout], **kwargs)


# -- the HF model ---------------------------------------------------------------------------------


@pytest.mark.parametrize("arch, layout", CASES)
@torch.no_grad()
def test_teacher_path_equals_transformers(arch, layout):
    teacher, student = student_of(arch, layout)
    x = ids()
    mask = torch.ones_like(x)
    mask[0, :5] = 0  # left padding
    assert max_diff(student(x, swiftkv=False).logits, teacher(x).logits) == 0.0  # measured: 0.0
    padded = student(x, attention_mask=mask, swiftkv=False).logits
    assert max_diff(padded[1], teacher(x, attention_mask=mask).logits[1]) <= 1e-6


@pytest.mark.parametrize("arch, layout", CASES)
@pytest.mark.parametrize("g", [1, 2])
@torch.no_grad()
def test_student_follows_the_reference_math(arch, layout, g):
    teacher, student = student_of(arch, layout, g, swiftkv_std=0.1)
    x = ids(1)
    h_n = teacher(x, output_hidden_states=True).hidden_states[N][0]
    expected = reference.mla_student_logits(student, x[0], h_n)
    got = student(x).logits[0]
    assert max_diff(got, expected) <= 1e-5
    assert max_diff(got, teacher(x).logits[0]) > 1e-2  # the student is another model: the check can fail


@pytest.mark.parametrize("arch", MLA_ARCHS)
@torch.no_grad()
def test_reference_routing_is_transformers_moe_block(arch):
    """The reference's DeepSeek routing (V2 group-limited greedy, V3 sigmoid with correction bias) and
    shared experts equal transformers' block on its own: the reference is right."""
    teacher, _ = student_of(arch, "q_lora")
    x = torch.randn(9, teacher.config.hidden_size)
    block = teacher.model.layers[N].mlp
    assert max_diff(reference.deepseek_moe(teacher.config, block, x), block(x[None])[0]) <= 1e-5
