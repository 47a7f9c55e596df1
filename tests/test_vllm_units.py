"""Fast checks of the vLLM glue that needs no engine: checkpoint-name routing (Snowflake and trimmed
layouts), the fast-prefill switch, CPU environment, `swiftkv serve` command line, bench arithmetic."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from swiftkv.vllm import kv_dtype

pytestmark = pytest.mark.vllm  # imports vLLM
SKIP_ROUTE = "skip"


@pytest.fixture(scope="module")
def config():
    from tests.tiny import tiny_swiftkv_config

    return tiny_swiftkv_config(
        vocab_size=64, num_key_value_layers=2, key_value_group_size=2, tie_word_embeddings=True, swiftkv=True
    )


@pytest.mark.parametrize(
    "name, expected",
    [
        ("model.embed_tokens.weight", ("model.early.embed_tokens.weight", None)),
        ("model.norm_swiftkv.weight", ("model.early.norm_swiftkv.weight", None)),
        ("model.norm.weight", ("model.late.norm.weight", None)),
        ("model.layers.1.self_attn.k_proj.weight", ("model.early.layers.1.self_attn.qkv_proj.weight", "k")),
        ("model.layers.0.mlp.up_proj.weight", ("model.early.layers.0.mlp.gate_up_proj.weight", 1)),
        (
            "model.layers.2.self_attn.q_proj_swiftkv.weight",
            ("model.late.layers.0.self_attn.q_proj_swiftkv.weight", None),
        ),
        ("model.layers.5.mlp.gate_proj.weight", ("model.late.layers.3.mlp.gate_up_proj.weight", 0)),
        # group 0 is owned by layer 2, group 1 by layer 4: K shards first, then V shards
        ("model.layers.2.self_attn.k_proj_swiftkv.weight", ("model.early.kv_proj_swiftkv.weight", 0)),
        ("model.layers.4.self_attn.k_proj_swiftkv.weight", ("model.early.kv_proj_swiftkv.weight", 1)),
        ("model.layers.4.self_attn.v_proj_swiftkv.weight", ("model.early.kv_proj_swiftkv.weight", 3)),
    ],
)
def test_checkpoint_names_route_to_vllm_parameters(config, name, expected):
    from swiftkv.vllm.weights import route

    assert route(config, name) == expected


@pytest.mark.parametrize(
    "name",
    [
        "model.layers.3.self_attn.q_proj.weight",  # a later layer's original q/k/v: dead weight, not allocated
        "model.layers.4.self_attn.v_proj.weight",
        "lm_head.weight",  # tied to the embedding
        "model.layers.1.self_attn.rotary_emb.inv_freq",
    ],
)
def test_dead_and_tied_tensors_are_skipped(config, name):
    from swiftkv.vllm.weights import SKIP, route

    assert route(config, name) is SKIP


@pytest.mark.parametrize(
    "name, message",
    [
        ("model.layers.3.self_attn.k_proj_swiftkv.weight", "does not own"),
        ("model.layers.9.mlp.up_proj.weight", "names layer 9"),
        ("encoder.weight", "unexpected tensor"),
    ],
)
def test_inconsistent_checkpoint_is_refused(config, name, message):
    from swiftkv.vllm.weights import route

    with pytest.raises(ValueError, match=message):
        route(config, name)


@pytest.mark.parametrize(
    "name, expected",
    [
        ("model.layers.1.self_attn.q_norm.weight", ("model.early.layers.1.self_attn.q_norm.weight", None)),
        (
            "model.layers.3.self_attn.q_norm_swiftkv.weight",
            ("model.late.layers.1.self_attn.q_norm_swiftkv.weight", None),
        ),
        ("model.layers.2.self_attn.k_norm_swiftkv.weight", ("model.early.k_norm_swiftkv.weight", 0)),
        ("model.layers.4.self_attn.k_norm_swiftkv.weight", ("model.early.k_norm_swiftkv.weight", 1)),
        ("model.layers.4.self_attn.k_norm.weight", SKIP_ROUTE),  # a later layer's teacher-only norms
        ("model.layers.5.self_attn.q_norm.weight", SKIP_ROUTE),
    ],
)
def test_qwen3_norms_route_to_vllm_parameters(name, expected):
    from swiftkv.vllm.weights import SKIP, route
    from tests.tiny import tiny_swiftkv_config

    config = tiny_swiftkv_config("qwen3", num_key_value_layers=2, key_value_group_size=2, swiftkv=True)
    assert route(config, name) is SKIP if expected is SKIP_ROUTE else route(config, name) == expected
    with pytest.raises(ValueError, match="does not own"):
        route(config, "model.layers.3.self_attn.k_norm_swiftkv.weight")


def test_qwen3_with_attention_bias_is_refused_on_vllm():
    from swiftkv.model.families import FAMILIES

    with pytest.raises(ValueError, match="no o_proj bias"):
        FAMILIES["qwen3"].biases(SimpleNamespace(attention_bias=True))
    assert not any(FAMILIES["qwen3"].biases(SimpleNamespace(attention_bias=False)).values())


def test_model_refuses_to_build_without_fast_prefill_and_hook_switches_it_on():
    from swiftkv.vllm.hooks import SwiftKVConfigHook
    from swiftkv.vllm.model import require_fast_prefill

    vllm_config = SimpleNamespace(
        cache_config=SimpleNamespace(kv_sharing_fast_prefill=False, cache_dtype="auto"),
        speculative_config=None,
        model_config=SimpleNamespace(hf_config=None),
    )
    with pytest.raises(ValueError, match="kv-sharing-fast-prefill"):
        require_fast_prefill(vllm_config)
    SwiftKVConfigHook.verify_and_update_config(vllm_config)
    assert vllm_config.cache_config.kv_sharing_fast_prefill is True
    require_fast_prefill(vllm_config)


def test_plugin_registers_architectures_with_vllm():
    from vllm import ModelRegistry
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP

    from swiftkv.model.families import ARCHITECTURES
    from swiftkv.vllm import register

    register()
    register()  # idempotent: vLLM may call it more than once per process
    assert set(ARCHITECTURES) <= set(ModelRegistry.get_supported_archs())
    assert all(MODELS_CONFIG_MAP[arch].__name__ == "SwiftKVConfigHook" for arch in ARCHITECTURES)


def test_cpu_env_uses_all_cpus_and_reserves_none():
    import os

    from swiftkv.vllm.env import configure_cpu_env

    env = {"VLLM_CPU_OMP_THREADS_BIND": "all"}  # not a value vLLM accepts
    configure_cpu_env(env)
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))
    assert env["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"
    kept = {"VLLM_CPU_OMP_THREADS_BIND": "0", "VLLM_CPU_NUM_OF_RESERVED_CPU": "1"}
    configure_cpu_env(kept)
    assert kept["VLLM_CPU_OMP_THREADS_BIND"] == "0" and kept["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "1"


def test_serve_command_adds_defaults_and_user_options_win():
    from swiftkv.dtypes import auto_dtype, dtype_name
    from swiftkv.vllm.serve import serve_command

    command = serve_command("/m", "alias", ["--port", "8001"])
    assert "--kv-sharing-fast-prefill" in command and command[-2:] == ["--port", "8001"]
    assert command[command.index("--dtype") + 1] == dtype_name(auto_dtype())  # the hardware's choice
    assert command[command.index("--served-model-name") + 1] == "alias"
    mine = serve_command("/m", "alias", ["--dtype=float32", "--gpu-memory-utilization", "0.3"])
    assert "--kv-cache-memory-bytes" not in mine and "--dtype" not in mine


def test_cli_rejects_bad_kv_memory(capsys):
    from swiftkv.cli import main

    assert main(["bench", "m", "--baseline", "b", "--kv-cache-memory", "lots"]) == 2
    assert "--kv-cache-memory 'LOTS' is not a size" in capsys.readouterr().err


def test_prefill_flops_per_token_of_smollm2_shape():
    from transformers import LlamaConfig

    from swiftkv.flops import prefill_flops_per_token

    config = LlamaConfig(
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        head_dim=64,
    )
    per_layer_weights = 576 * (2 * 576 + 2 * 192) + 3 * 576 * 1536  # q,o + k,v + gate,up,down
    attention = 2 * 2 * 576 * 1000.5  # QK^T and AV over (2000 + 1) / 2 keys on average (causal)
    assert prefill_flops_per_token(config, 2000) == pytest.approx(30 * (2 * per_layer_weights + attention))


def test_bench_workloads_subset_runs_and_reports_only_those():
    """--workloads prefill,ttft: the schedule holds the warm-up and those workloads (TTFT repeated),
    and the table, ratios and plot rows cover only what was measured."""
    from swiftkv.bench.offline import Workloads, compare, format_table, parse_workloads, run_interleaved

    class FakeWorker:
        def __init__(self, speed):
            self.facts, self.speed, self.ran = {"kv_cache_tokens": 100}, speed, []

        def run(self, name):
            self.ran.append(name)
            return {
                "warmup": {"warmup_s": 1.0},
                "prefill": {"prefill_tok_s": 100.0 * self.speed},
                "ttft": {"ttft_s": 2.0 / self.speed},
            }[name]

    names = parse_workloads("ttft, prefill")
    assert names == ("prefill", "ttft")
    workers = [FakeWorker(1.0), FakeWorker(2.0)]
    base, swift = run_interleaved(workers, Workloads(ttft_repeats=3), names)
    assert workers[0].ran == ["warmup", "prefill", "ttft", "ttft", "ttft"]
    assert "tpot_s" not in base and swift["ttft_s"] == 1.0
    report = {
        "baseline": base,
        "swiftkv": swift,
        "ratio": compare(base, swift),
        "settings": {"dtype": "float32"},
        "peak_flops": 1e9,
        "flops_per_token": 1e6,
    }
    assert report["ratio"] == {"prefill_tok_s": 2.0, "ttft_s": 0.5, "kv_cache_tokens": 1.0}
    table = format_table(report)
    assert "prefill throughput" in table and "TPOT" not in table and "10:1" not in table


@pytest.mark.parametrize("text", ["prefill,decode", ","])
def test_bench_rejects_unknown_workloads(text, capsys):
    from swiftkv.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["bench", "m", "--baseline", "b", "--workloads", text])
    assert (
        exited.value.code == 2
        and "expected a comma-separated subset of prefill,ttft,tpot,e2e" in capsys.readouterr().err
    )


def test_bench_workloads_do_not_apply_online(capsys):
    from swiftkv.cli import main

    assert main(["bench", "m", "--baseline", "b", "--online", "--workloads", "prefill"]) == 2
    assert "--workloads chooses the offline benchmark's workloads" in capsys.readouterr().err


# -- speculative decoding and KV-cache dtypes beside SwiftKV (swiftkv/vllm/speculative.py, kv_dtype.py) --


def test_our_method_and_dtype_lists_are_vllms():
    """speculative.py and kv_dtype.py name vLLM 0.32's and 0.33's methods and CPU cache dtypes without importing
    vLLM; a vLLM upgrade that changes them must fail here."""
    from typing import get_args

    from vllm.config.speculative import EagleModelTypes, SpeculativeMethod
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    from swiftkv.vllm.kv_dtype import CPU_KV_CACHE_DTYPES
    from swiftkv.vllm.speculative import HIDDEN_STATE_METHODS, VLLM_METHODS

    def flat(literal):
        return {leaf for arg in get_args(literal) for leaf in (flat(arg) if get_args(arg) else {arg})}

    # Ours are 0.32's and 0.33's: the installed vLLM's, and at most the few the other one differs by.
    assert flat(SpeculativeMethod) <= set(VLLM_METHODS)
    assert set(VLLM_METHODS) - flat(SpeculativeMethod) <= {"step5_mtp", "medusa", "mlp_speculator"}
    assert flat(EagleModelTypes) | {"dspark"} <= set(HIDDEN_STATE_METHODS)
    assert set(HIDDEN_STATE_METHODS) - flat(EagleModelTypes) <= {"dspark", "step5_mtp"}
    assert tuple(CPUAttentionBackend.supported_kv_cache_dtypes) == CPU_KV_CACHE_DTYPES


@pytest.fixture(scope="module")
def swiftkv_and_draft_folders(tmp_path_factory):
    from tests.tiny import random_student, save_tiny_folder, save_tiny_teacher, tiny_tokenizer

    root = tmp_path_factory.mktemp("spec_configs")
    tokenizer = tiny_tokenizer()
    shape = dict(
        vocab_size=max(128, len(tokenizer)), hidden_size=128
    )  # head_dim 32: fp8 on CPU needs 32 | head_dim
    _, model = random_student("llama", n=2, g=2, **shape)
    student = save_tiny_folder(root / "student", model, tokenizer)
    draft = save_tiny_teacher(root / "draft", hidden_size=128, num_hidden_layers=2)
    return student, draft


@pytest.mark.parametrize(
    ("speculative", "kv_cache_dtype", "message"),
    [
        (
            {"method": "draft_model", "model": "DRAFT", "num_speculative_tokens": 2},
            "auto",
            "speculative method 'draft_model' cannot run with SwiftKV: vLLM registers the draft model's attention layers",
        ),
        (
            {"model": "DRAFT", "num_speculative_tokens": 2},
            "auto",
            "speculative method 'draft_model' cannot run",
        ),
        (
            {"method": "eagle3", "model": "DRAFT", "num_speculative_tokens": 2},
            "auto",
            "speculative method 'eagle3' cannot run with SwiftKV: it drafts from the target model's hidden states",
        ),
        (
            None,
            "fp8_inc",
            "--kv-cache-dtype 'fp8_inc' is not supported by vLLM's CPU attention; expected one of auto, "
            "fp8, fp8_e4m3, fp8_e5m2",
        ),
    ],
)
def test_vllm_engine_config_of_a_swiftkv_model_refuses_what_cannot_run(
    swiftkv_and_draft_folders, speculative, kv_cache_dtype, message
):
    """What `vllm.LLM(model=FOLDER, speculative_config=...)` builds first: the plugin's config hook refuses
    with the same error as `swiftkv serve`, before any engine starts."""
    import re

    from vllm.engine.arg_utils import EngineArgs

    student, draft = swiftkv_and_draft_folders
    if speculative is not None:
        speculative = {key: str(draft) if value == "DRAFT" else value for key, value in speculative.items()}
    args = EngineArgs(
        model=str(student), speculative_config=speculative, kv_cache_dtype=kv_cache_dtype, max_model_len=256
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        args.create_engine_config()


def test_vllm_engine_config_of_a_swiftkv_model_accepts_ngram_and_fp8(swiftkv_and_draft_folders):
    """ngram with the fp8 cache where this CPU has vLLM's fp8 kernels (AVX-512 or AMX), ngram alone where not."""
    from vllm.engine.arg_utils import EngineArgs

    student, _ = swiftkv_and_draft_folders
    kv_cache_dtype = "fp8" if kv_dtype.cpu_has_fp8_kernels() else "auto"
    config = EngineArgs(
        model=str(student),
        kv_cache_dtype=kv_cache_dtype,
        max_model_len=256,
        speculative_config={"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3},
    ).create_engine_config()
    assert config.speculative_config.method == "ngram" and config.cache_config.cache_dtype == kv_cache_dtype
    assert config.cache_config.kv_sharing_fast_prefill is True


def test_vllm_engine_config_refuses_fp8_on_a_cpu_without_its_kernels(swiftkv_and_draft_folders, monkeypatch):
    """On a CPU without AVX-512 or AMX, vLLM 0.32 would fail inside the engine after the model loaded; the
    plugin's config hook refuses first, with the fix in the message."""
    from vllm.engine.arg_utils import EngineArgs

    monkeypatch.setattr(kv_dtype, "cpu_has_fp8_kernels", lambda: False)
    student, _ = swiftkv_and_draft_folders
    args = EngineArgs(model=str(student), kv_cache_dtype="fp8", max_model_len=256)
    with pytest.raises(
        ValueError, match="--kv-cache-dtype fp8 needs a CPU with AVX-512 or AMX .*use --kv-cache-dtype auto"
    ):
        args.create_engine_config()


@pytest.mark.parametrize(
    ("version", "supported"),
    [
        ("0.26.0", True),
        ("0.32.0", True),
        ("0.32.0+cpu", True),
        ("0.29.1rc1", True),
        ("0.25.2", False),
        ("0.33.0", True),
        ("0.34.0", False),
        ("1.0.0", False),
    ],
)
def test_vllm_outside_the_supported_range_is_one_error_naming_it(version, supported):
    from swiftkv.vllm.versions import check_vllm_version

    if supported:
        check_vllm_version(version)
        return
    with pytest.raises(
        ValueError, match=rf"swiftkv supports vLLM 0\.26 to 0\.33\.x, and vLLM {re.escape(version)} "
    ):
        check_vllm_version(version)


def test_the_plugin_and_swiftkv_serve_refuse_an_unsupported_vllm_before_any_engine(
    monkeypatch, tmp_path, capsys
):
    import vllm

    from swiftkv.cli import main
    from swiftkv.vllm import register
    from tests.tiny import save_tiny_folder, tiny_student

    monkeypatch.setattr(vllm, "__version__", "0.34.0")
    with pytest.raises(
        ValueError, match="supports vLLM 0.26 to 0.33.x, and vLLM 0.34.0 is installed: vLLM 0.34 removed"
    ):
        register()  # what vLLM calls in each of its processes
    monkeypatch.setattr("swiftkv.vllm.versions.installed_vllm_version", lambda: "0.25.0")
    monkeypatch.setattr("os.execve", lambda *args: pytest.fail("the server started"))
    assert main(["serve", str(save_tiny_folder(tmp_path / "m", tiny_student()))]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(errors) == 1 and "vLLM 0.25.0 is installed" in errors[0], errors


def test_a_swiftkv_engine_on_cuda_runs_the_v1_model_runner_and_refuses_v2(monkeypatch):
    """vLLM's CUDA engine defaults to its V2 model runner from 0.27 on; the plugin's fast-prefill contract is
    verified on V1 only, so the config hook picks V1 unless V2 was asked for, which is refused. A CPU (V1
    only) is left alone, and so is a vLLM that has no V1 runner."""
    import os

    from vllm.platforms import current_platform

    from swiftkv.vllm.env import RUNNER_ENV, choose_model_runner
    from swiftkv.vllm.hooks import SwiftKVConfigHook

    def config():
        return SimpleNamespace(
            cache_config=SimpleNamespace(kv_sharing_fast_prefill=True, cache_dtype="auto"),
            speculative_config=None,
            model_config=SimpleNamespace(hf_config=None),
        )

    env = {}
    assert choose_model_runner(env, on_cuda=False, has_v1_runner=True) is False and env == {}
    monkeypatch.delenv(RUNNER_ENV, raising=False)
    monkeypatch.setattr(current_platform, "is_cuda", lambda: True)
    monkeypatch.setattr(current_platform, "is_cpu", lambda: False)
    SwiftKVConfigHook.verify_and_update_config(config())
    assert os.environ[RUNNER_ENV] == "0"
    monkeypatch.setenv(RUNNER_ENV, "1")
    with pytest.raises(
        ValueError, match=f"{RUNNER_ENV}=1: SwiftKV is verified on vLLM's V1 model runner only"
    ):
        SwiftKVConfigHook.verify_and_update_config(config())

    # A vLLM without the V1 runner (0.34 on, run only with the version override): V2 is the only runner
    # and vLLM itself refuses RUNNER_ENV=0, so the hook leaves the variable as it is.
    import vllm

    monkeypatch.setattr(vllm, "__version__", "0.34.0")
    SwiftKVConfigHook.verify_and_update_config(config())
    assert os.environ[RUNNER_ENV] == "1"
    monkeypatch.delenv(RUNNER_ENV)
    SwiftKVConfigHook.verify_and_update_config(config())
    assert RUNNER_ENV not in os.environ
