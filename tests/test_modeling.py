"""The SwiftKV model: teacher == transformers, student == the paper math, fast paths == slow path."""

from __future__ import annotations

import pytest
import torch

from swiftkv.generation import kv_cache_bytes
from tests import reference
from tests.tiny import random_student, tiny_swiftkv_config

LAYERS, N = 6, 2
GROUP_SIZES = [g for g in range(1, LAYERS - N + 1) if (LAYERS - N) % g == 0]  # 1, 2, 4
ARCHS = ["llama", "qwen2", "qwen3", "mistral"]


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max())


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(1234)


def ids(batch: int = 2, seq: int = 17) -> torch.Tensor:
    return torch.randint(3, 120, (batch, seq))


@pytest.mark.parametrize("arch", ARCHS)
@torch.no_grad()
def test_teacher_path_equals_transformers(arch):
    teacher, student = random_student(arch, N)
    student.set_swiftkv(False)
    x = ids()
    assert max_diff(student(x).logits, teacher(x).logits) <= 1e-5
    mask = torch.ones_like(x)
    mask[0, :5] = 0  # left padding
    assert (
        max_diff(student(x, attention_mask=mask).logits[1], teacher(x, attention_mask=mask).logits[1]) <= 1e-5
    )


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("g", GROUP_SIZES)
@torch.no_grad()
def test_student_follows_paper_math(arch, g):
    teacher, student = random_student(arch, N, g)
    x = ids(batch=1)
    h_n = teacher(x, output_hidden_states=True).hidden_states[N][0]
    expected = reference.student_logits(student, x[0], h_n)
    assert max_diff(student(x).logits[0], expected) <= 1e-5


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("g", [1, 2])
@torch.no_grad()
def test_padded_batch_equals_single_sequences(arch, g):
    _, student = random_student(arch, N, g)
    long, short = ids(1, 15)[0], ids(1, 9)[0]
    batch = torch.full((2, 15), 0)
    batch[0], batch[1, 6:] = long, short
    mask = torch.zeros_like(batch)
    mask[0], mask[1, 6:] = 1, 1
    out = student(batch, attention_mask=mask).logits
    assert max_diff(out[0], student(long[None]).logits[0]) <= 1e-5
    assert max_diff(out[1, 6:], student(short[None]).logits[0]) <= 1e-5


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("g", GROUP_SIZES)
@torch.no_grad()
def test_incremental_decoding_equals_full_forward(arch, g):
    _, student = random_student(arch, N, g)
    x = ids(2, 16)
    full = student(x).logits
    out = student(x[:, :10], use_cache=True)
    steps, cache = [out.logits], out.past_key_values
    for t in range(10, 16):
        out = student(x[:, t : t + 1], past_key_values=cache, use_cache=True)
        steps.append(out.logits)
    assert max_diff(torch.cat(steps, 1), full) <= 1e-5


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("g", [1, 2])
@torch.no_grad()
def test_prefill_skip_matches_full_student(arch, g):
    _, student = random_student(arch, N, g)
    x = ids(2, 21)
    full = student(x).logits
    assert student(x, logits_to_keep=1).logits.shape[1] == 1
    assert max_diff(student(x, logits_to_keep=1).logits, full[:, -1:]) <= 1e-4
    assert max_diff(student(x, logits_to_keep=3).logits, full[:, -3:]) <= 1e-4
    rows = torch.tensor([0, 7, 20])
    assert max_diff(student(x, logits_to_keep=rows).logits, full[:, rows]) <= 1e-4
    # With a cache: the skipped prefill must still have written every later group's K/V.
    cache = student(x[:, :15], use_cache=True, logits_to_keep=1).past_key_values
    rest = student(x[:, 15:], past_key_values=cache, use_cache=True).logits
    assert max_diff(rest, full[:, 15:]) <= 1e-4


@torch.no_grad()
def test_prefill_skip_with_padding_matches_full_student():
    _, student = random_student("llama", N, 2)
    x = ids(2, 12)
    mask = torch.ones_like(x)
    mask[1, :4] = 0
    full = student(x, attention_mask=mask).logits
    assert max_diff(student(x, attention_mask=mask, logits_to_keep=2).logits, full[:, -2:]) <= 1e-4


@pytest.mark.parametrize("arch", ARCHS)
@torch.no_grad()
def test_generate_equals_greedy_full_forwards(arch):
    _, student = random_student(arch, N, 2)
    x = ids(1, 8)
    generated = student.generate(
        x, attention_mask=torch.ones_like(x), max_new_tokens=8, do_sample=False, pad_token_id=0
    )
    expected = x
    for _ in range(8):  # no cache, no skip: the slow reference loop
        next_id = student(expected).logits[:, -1].argmax(-1, keepdim=True)
        expected = torch.cat([expected, next_id], 1)
    assert torch.equal(generated, expected)


@pytest.mark.parametrize("g", GROUP_SIZES)
@torch.no_grad()
def test_acrosskv_cache_holds_one_kv_per_group(g):
    teacher, student = random_student("llama", N, g)
    x = ids(1, 32)
    teacher_bytes = kv_cache_bytes(teacher(x, use_cache=True).past_key_values)
    student_bytes = kv_cache_bytes(student(x, use_cache=True, logits_to_keep=1).past_key_values)
    assert student_bytes / teacher_bytes == pytest.approx((N + (LAYERS - N) / g) / LAYERS)


@torch.no_grad()
def test_hidden_states_output_has_every_layer():
    _, student = random_student("llama", N)
    out = student(ids(1, 5), output_hidden_states=True)
    assert len(out.hidden_states) == LAYERS + 1


def test_set_swiftkv_refuses_a_model_without_swiftkv_layers():
    from swiftkv import LlamaSwiftKVForCausalLM

    model = LlamaSwiftKVForCausalLM(tiny_swiftkv_config())
    with pytest.raises(ValueError, match="no SwiftKV layers"):
        model.set_swiftkv(True)


@pytest.mark.parametrize(
    "n, g, message", [(0, 1, "out of range"), (6, 1, "out of range"), (2, 3, "does not divide")]
)
def test_bad_geometry_is_refused(n, g, message):
    from swiftkv import SwiftKVConfigError

    with pytest.raises(SwiftKVConfigError, match=message):
        tiny_swiftkv_config(num_key_value_layers=n, key_value_group_size=g)
