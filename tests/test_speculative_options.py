"""Speculative methods and KV-cache dtypes beside SwiftKV: what is accepted, and the one error for the
rest, from `swiftkv serve`'s command line before any server starts (no vLLM needed). The same checks
inside vLLM's config hook are tested in test_vllm_units.py; the working methods on the real engine in
test_vllm_speculative.py."""

from __future__ import annotations

import json

import pytest

from swiftkv.vllm.kv_dtype import check_kv_cache_dtype
from swiftkv.vllm.speculative import (
    HIDDEN_STATE_METHODS,
    check_speculative_config,
    check_speculative_method,
    check_speculative_options,
    resolve_method,
    speculative_options,
)


@pytest.mark.parametrize(
    "config",
    [
        {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4},
        {"model": "ngram", "num_speculative_tokens": 3},
        {"method": "[ngram]", "num_speculative_tokens": 3},
        None,
    ],
)
def test_ngram_and_no_speculation_are_accepted(config):
    check_speculative_config(config, with_suffix=False)


@pytest.mark.parametrize(
    "method",
    [
        *HIDDEN_STATE_METHODS[:6],
        "mtp",
        "deepseek_mtp",
        "medusa",
        "mlp_speculator",
        "ngram_gpu",
        "custom_class",
        "draft_model",
    ],
)
def test_every_other_method_is_one_error_naming_it_and_what_works(method):
    with pytest.raises(ValueError) as refused:
        check_speculative_config(
            {"method": method, "model": "some/checkpoint", "num_speculative_tokens": 2}, with_suffix=False
        )
    message = str(refused.value)
    assert f"speculative method {method!r} cannot run with SwiftKV: " in message
    assert (
        "Speculative methods that work with SwiftKV: 'ngram' (" in message and '"method": "ngram"' in message
    )
    assert "\n" not in message


def test_reasons_say_why():
    def refusal(method):
        with pytest.raises(ValueError) as refused:
            check_speculative_method(method, with_suffix=True)
        return str(refused.value)

    assert "prompt tokens never reach the later layers" in refusal("eagle3")
    assert "silently losing SwiftKV's prefill saving" in refusal("draft_model")
    assert "'ngram' or 'suffix'" in refusal("medusa")  # suffix is offered only where it is installed


@pytest.mark.parametrize(
    ("config", "method"),
    [
        ({"model": "org/llama-68m", "num_speculative_tokens": 3}, "draft_model"),  # vLLM infers a draft model
        ({"model": "my_pkg.proposers.Lookup"}, "custom_class"),  # a dotted path is a proposer class
        ({"method": "deepseek_mtp"}, "deepseek_mtp"),
        ({"num-speculative-tokens": 2, "method": "ngram"}, "ngram"),  # dashes as on the command line
    ],
)
def test_method_is_resolved_as_vllm_does(config, method):
    assert resolve_method(config) == method


def test_a_config_without_method_or_model_is_refused():
    with pytest.raises(ValueError, match="names neither a method nor a model"):
        check_speculative_config({"num_speculative_tokens": 2}, with_suffix=False)


def test_suffix_depends_on_arctic_inference():
    check_speculative_method("suffix", with_suffix=True)
    with pytest.raises(
        ValueError,
        match="'suffix' cannot run with SwiftKV here: suffix decoding needs the arctic-inference package",
    ):
        check_speculative_method("suffix", with_suffix=False)


def test_unknown_method_is_refused():
    with pytest.raises(ValueError, match="'lookahead' is not one vLLM knows"):
        check_speculative_method("lookahead", with_suffix=False)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--port", "1"], None),
        (
            ["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 4}'],
            {"method": "ngram", "num_speculative_tokens": 4},
        ),
        (['-sc={"model": "ngram"}'], {"model": "ngram"}),
        (
            ["--speculative-config.method", "eagle", "--speculative-config.model=x/y"],
            {"method": "eagle", "model": "x/y"},
        ),
        (["--spec-method", "suffix", "--spec-model", "m"], {"method": "suffix", "model": "m"}),
    ],
)
def test_serve_reads_every_form_of_the_speculative_options(args, expected):
    assert speculative_options(args) == expected


def test_serve_options_refuse_before_the_engine():
    assert (
        check_speculative_options(
            ["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 2}'], with_suffix=False
        )
        == "ngram"
    )
    with pytest.raises(ValueError, match="'eagle3' cannot run with SwiftKV"):
        check_speculative_options(["-sc", '{"method": "eagle3", "model": "a/b"}'], with_suffix=False)
    with pytest.raises(ValueError, match=r"--speculative-config '\{method: ngram\}' is not JSON"):
        check_speculative_options(["--speculative-config", "{method: ngram}"], with_suffix=False)
    with pytest.raises(ValueError, match="is not a JSON object"):
        check_speculative_options(["--speculative-config", '["ngram"]'], with_suffix=False)


def write_config(folder, head_dim=64):
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(
        json.dumps({"model_type": "llama_swiftkv", "hidden_size": 4 * head_dim, "num_attention_heads": 4})
    )
    return folder


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--speculative-config", '{"method": "eagle", "model": "yuhuili/EAGLE-LLaMA3-Instruct-8B"}'],
            "speculative method 'eagle' cannot run with SwiftKV: it drafts from the target model's hidden states",
        ),
        (
            ["--spec-model", "org/draft-68m", "--spec-tokens", "3"],
            "speculative method 'draft_model' cannot run",
        ),
        (
            ["--kv-cache-dtype", "bfloat16"],
            "--kv-cache-dtype 'bfloat16' is not supported by vLLM's CPU attention; "
            "expected one of auto, fp8, fp8_e4m3, fp8_e5m2",
        ),
    ],
)
def test_swiftkv_serve_refuses_in_one_line_before_the_server(tmp_path, capsys, monkeypatch, args, message):
    """The CLI exits with one line; the server (an exec) is never reached."""
    import os

    from swiftkv.cli import main

    monkeypatch.setattr(os, "execve", lambda *a: pytest.fail(f"the server was started: {a}"))
    folder = write_config(tmp_path / "m")
    assert main(["serve", str(folder), *args]) == 2
    err = capsys.readouterr().err
    assert f"swiftkv serve: error: {message}" in err and err.count("\n") == 1


def test_kv_cache_dtypes_of_vllm_cpu():
    for dtype in (None, "auto", "fp8", "fp8_e4m3", "fp8_e5m2"):
        check_kv_cache_dtype(dtype, head_dim=64, fp8_kernels=True)
    for dtype in ("float16", "int8_per_token_head", "fp8_inc", "nvfp4", "fp16"):
        with pytest.raises(
            ValueError,
            match=f"--kv-cache-dtype '{dtype}' is not supported by vLLM's CPU attention; "
            "expected one of auto, fp8, fp8_e4m3, fp8_e5m2",
        ):
            check_kv_cache_dtype(dtype, head_dim=64, fp8_kernels=True)
    with pytest.raises(ValueError, match="needs a CPU with AVX-512 or AMX"):
        check_kv_cache_dtype("fp8", head_dim=64, fp8_kernels=False)
    check_kv_cache_dtype("auto", head_dim=48, fp8_kernels=False)
    with pytest.raises(
        ValueError, match="needs a head size divisible by 32 on vLLM's CPU engine; this model's is 48"
    ):
        check_kv_cache_dtype("fp8_e5m2", head_dim=48, fp8_kernels=True)
