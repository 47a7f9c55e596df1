"""`swiftkv bench --moe` (`swiftkv.bench.moe`): the random Qwen3-MoE shape, its checks, and one end-to-end run on a
tiny shape on vLLM's CPU engine (both engines, interleaved prefills, JSON and PNG, the FLOP bound)."""

from __future__ import annotations

import json

import pytest

from swiftkv.bench.moe import MoeShape, weight_bytes
from swiftkv.bench.online import OnlineSettings
from swiftkv.cli import build_parser, main
from swiftkv.cli.bench import MOE_DEST
from swiftkv.cli.options import given_values
from swiftkv.flops import layer_linear_flops, prefill_flops_per_token


def test_the_default_shape_is_qwen3_30b_a3b_layer():
    teacher, student = MoeShape().teacher_config(), MoeShape().student_config()
    assert (
        teacher.hidden_size,
        teacher.num_attention_heads,
        teacher.num_key_value_heads,
        teacher.head_dim,
    ) == (
        2048,
        32,
        4,
        128,
    )
    assert (teacher.moe_intermediate_size, teacher.num_experts_per_tok, teacher.num_experts) == (768, 8, 32)
    assert (
        student.model_type == "qwen3_moe_swiftkv"
        and student.num_key_value_layers == teacher.num_hidden_layers // 2
    )
    # every layer sparse: router, 8 experts of 768
    assert layer_linear_flops(teacher, 0)["mlp"] == 2 * 2048 * 32 + 8 * 6 * 2048 * 768
    per_layer = 2048 * (4096 + 512 + 512 + 4096) + 3 * 2048 * 768 * 32 + 2048 * 32  # q k v o, experts, router
    assert weight_bytes(teacher, 2) == 2 * (2 * 32768 * 2048 + 16 * per_layer)


@pytest.mark.parametrize(
    "change, expected",
    [
        (
            {"hidden_size": 2000},
            "hidden_size=2000, but vLLM's CPU fused MoE needs a hidden size divisible by 32",
        ),
        ({"experts": 4}, "expected at least 2 layers and at least 8 experts"),
        ({"repeats": 0}, "must be at least 1"),
    ],
)
def test_a_shape_vllm_cannot_run_is_refused_before_any_engine(change, expected):
    import dataclasses

    with pytest.raises(ValueError, match=expected.replace("(", r"\(")):
        dataclasses.replace(MoeShape(), **change).check()


def test_the_cli_refuses_models_with_moe_and_moe_options_without_it(capsys):
    assert main(["bench", "--moe", "m", "--baseline", "b"]) == 2
    assert "--moe benchmarks random models of its own shape" in capsys.readouterr().err
    assert main(["bench", "m", "--baseline", "b", "--moe-layers", "8"]) == 2
    assert "--moe-layers only apply with --moe" in capsys.readouterr().err
    assert main(["bench", "--moe", "--workloads", "prefill"]) == 2
    assert "does not apply with --moe" in capsys.readouterr().err


def test_the_moe_options_keep_apart_from_the_online_options_of_the_same_field_name():
    """MoeShape.prompt_len and OnlineSettings.prompt_len are both fields named prompt_len: on one parser they
    would share argparse's dest, so --prompt-len read as --moe-prompt-len (refused without --moe)."""
    online = build_parser().parse_args(["bench", "m", "--baseline", "b", "--online", "--prompt-len", "256"])
    assert given_values(online, MoeShape, MOE_DEST) == {}
    assert given_values(online, OnlineSettings)["prompt_len"] == 256
    moe = build_parser().parse_args(["bench", "--moe", "--moe-prompt-len", "64", "--moe-repeats", "2"])
    assert given_values(moe, MoeShape, MOE_DEST) == {"prompt_len": 64, "repeats": 2}
    assert "prompt_len" not in given_values(moe, OnlineSettings)


@pytest.mark.vllm
@pytest.mark.timeout(300)
@pytest.mark.parametrize("one_at_a_time", [False, True], ids=["both-alive", "one-at-a-time"])
def test_the_moe_bench_runs_both_engines_and_reports_against_the_bound(tmp_path, one_at_a_time):
    from dataclasses import replace

    from swiftkv.bench.moe import format_table, moe_bench
    from swiftkv.bench.offline import BenchSettings

    # one at a time, a round each: every engine start costs ~15 s here
    shape = replace(MoeShape.quick(), one_at_a_time=one_at_a_time, repeats=1 if one_at_a_time else 2)
    settings = BenchSettings(dtype="float32", enforce_eager=True, max_model_len=512, out=str(tmp_path))
    report = moe_bench(settings, shape)
    written = json.loads((tmp_path / "bench-moe.json").read_text())
    assert written == report.to_json()
    assert (tmp_path / "bench-moe.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    base, swift = report.baseline, report.swiftkv
    assert (base.architecture, swift.architecture) == ("Qwen3MoeConfig", "Qwen3MoeSwiftKVConfig")
    assert swift.fast_prefill
    assert len(base.prefill_tok_s_runs) == len(swift.prefill_tok_s_runs) == shape.repeats
    assert min(base.prefill_tok_s_runs + swift.prefill_tok_s_runs) > 0
    flops = [
        prefill_flops_per_token(c, shape.prompt_len) for c in (shape.teacher_config(), shape.student_config())
    ]
    assert (base.flops_per_token, swift.flops_per_token) == tuple(flops)
    assert report.flop_bound == pytest.approx(flops[0] / flops[1]) and 1.5 < report.flop_bound < 2
    assert report.prefill_ratio == pytest.approx(swift.prefill_tok_s / base.prefill_tok_s)
    assert report.fraction_of_bound == pytest.approx(report.prefill_ratio / report.flop_bound)
    assert base.prefill_utilization == pytest.approx(base.prefill_tok_s * flops[0] / report.peak_flops)
    assert base.peak_rss_mib > 100 and swift.peak_rss_mib > 100
    assert written["settings"]["load_format"] == "dummy" and written["num_key_value_layers"] == 2
    assert written["shape"]["one_at_a_time"] is one_at_a_time
    # the KV cache sized for the batch: 4 layers x K, V x 2 heads x 32 x 4 bytes, 512 tokens (max_model_len) x 1.25
    assert written["settings"]["kv_cache_memory_bytes"] == 1.25 * 512 * 4 * 2 * 2 * 32 * 4
    print(format_table(report))
