"""Conversion: inits, lstsq fit, trim, save/load round trip, Snowflake format, and bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

import swiftkv  # noqa: F401 - registers the Auto classes
from swiftkv.cli import main
from swiftkv.convert import ConvertSettings, convert
from swiftkv.convert.calibration import ridge_fit
from tests.tiny import WORDS, save_tiny_teacher

N, G = 2, 2


@pytest.fixture(scope="module")
def calib_text(tmp_path_factory) -> Path:
    """Plain text over the tiny tokenizer's words: enough for fit and held-out blocks."""
    generator = torch.Generator().manual_seed(0)
    picks = torch.randint(len(WORDS), (6000,), generator=generator).tolist()
    path = tmp_path_factory.mktemp("calib") / "text.txt"
    path.write_text(" ".join(WORDS[i] for i in picks))
    return path


@pytest.fixture(scope="module", params=["llama", "qwen2", "qwen3", "mistral"])
def teacher_dir(request, tmp_path_factory) -> Path:
    return save_tiny_teacher(tmp_path_factory.mktemp(f"teacher-{request.param}"), request.param)


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory) -> Path:
    return save_tiny_teacher(tmp_path_factory.mktemp("teacher-llama"), "llama")


@pytest.fixture
def no_loading(monkeypatch):
    """Proves a check ran before any model was loaded: loading fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the bad input was reported")

    monkeypatch.setattr("swiftkv.sources.load_folder_model", refuse)  # every model load goes through it


def run_convert(teacher_dir, dst, calib_text, **kwargs):
    options = dict(
        num_key_value_layers=N,
        key_value_group_size=G,
        init="lstsq",
        calib_data=str(calib_text),
        calib_tokens=1024,
        eval_tokens=512,
    )
    return convert(ConvertSettings(source=str(teacher_dir), out=dst, **{**options, **kwargs}))


def weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(folder / "model.safetensors")


def test_copy_and_mean_init_follow_the_reference(teacher_dir, tmp_path, calib_text):
    teacher = weights(teacher_dir)
    for init in ("copy", "mean"):
        run_convert(teacher_dir, tmp_path / init, calib_text, init=init)
        out = weights(tmp_path / init)
        assert torch.equal(
            out["model.norm_swiftkv.weight"], teacher[f"model.layers.{N}.input_layernorm.weight"]
        )
        for i in range(N, 6):
            assert torch.equal(
                out[f"model.layers.{i}.self_attn.q_proj_swiftkv.weight"],
                teacher[f"model.layers.{i}.self_attn.q_proj.weight"],
            )
        for owner in range(N, 6, G):
            group = [teacher[f"model.layers.{j}.self_attn.k_proj.weight"] for j in range(owner, owner + G)]
            expected = group[0] if init == "copy" else torch.stack(group).mean(0)
            assert torch.allclose(out[f"model.layers.{owner}.self_attn.k_proj_swiftkv.weight"], expected)
            assert f"model.layers.{owner + 1}.self_attn.k_proj_swiftkv.weight" not in out  # not an owner
        if "model.layers.0.self_attn.q_norm.weight" in teacher:  # Qwen3: the reference's norm inits
            for i in range(N, 6):
                assert torch.equal(
                    out[f"model.layers.{i}.self_attn.q_norm_swiftkv.weight"],
                    teacher[f"model.layers.{i}.self_attn.q_norm.weight"],
                )
            for owner in range(N, 6, G):
                norms = [
                    teacher[f"model.layers.{j}.self_attn.k_norm.weight"] for j in range(owner, owner + G)
                ]
                assert torch.allclose(
                    out[f"model.layers.{owner}.self_attn.k_norm_swiftkv.weight"], torch.stack(norms).mean(0)
                )
                assert f"model.layers.{owner + 1}.self_attn.k_norm_swiftkv.weight" not in out


def test_lstsq_reconstructs_kv_better_than_copy(teacher_dir, tmp_path, calib_text):
    report = run_convert(teacher_dir, tmp_path / "out", calib_text)
    for name in ("k", "v"):
        copy_error = sum(report.kv_relative_error["copy"][name])
        lstsq_error = sum(report.kv_relative_error["lstsq"][name])
        assert lstsq_error < copy_error
    recorded = json.loads((tmp_path / "out" / "config.json").read_text())["swiftkv_conversion"]
    assert recorded["init"] == "lstsq" and recorded["source"] == str(teacher_dir)


def test_ridge_fit_recovers_a_linear_map():
    torch.manual_seed(0)
    x, weight, bias = torch.randn(500, 16), torch.randn(8, 16), torch.randn(8)
    fitted_weight, fitted_bias = ridge_fit(x, x @ weight.T + bias, ridge=1e-9, with_bias=True)
    assert torch.allclose(fitted_weight, weight, atol=1e-4) and torch.allclose(fitted_bias, bias, atol=1e-4)


def test_round_trip_trim_and_student_logits(teacher_dir, tmp_path, calib_text):
    run_convert(teacher_dir, tmp_path / "full", calib_text)
    run_convert(teacher_dir, tmp_path / "trim", calib_text, trim=True)
    full = AutoModelForCausalLM.from_pretrained(tmp_path / "full").eval()
    trimmed = AutoModelForCausalLM.from_pretrained(tmp_path / "trim").eval()
    assert type(full).__name__.endswith("SwiftKVForCausalLM") and full.config.swiftkv
    trimmed_keys = weights(tmp_path / "trim").keys()
    for name in (
        "q_proj",
        "k_proj",
        "v_proj",
        *(("q_norm", "k_norm") if full.model.layers[0].self_attn.qk_norm else ()),
    ):
        assert f"model.layers.{N}.self_attn.{name}.weight" not in trimmed_keys
        assert f"model.layers.{N - 1}.self_attn.{name}.weight" in trimmed_keys
    x = torch.randint(4, 60, (1, 12))
    with torch.no_grad():
        assert float((full(x).logits - trimmed(x).logits).abs().max()) <= 1e-6
        full.set_swiftkv(False)
        teacher = AutoModelForCausalLM.from_pretrained(teacher_dir).eval()
        assert float((full(x).logits - teacher(x).logits).abs().max()) <= 1e-5
        with pytest.raises(ValueError, match="--trim"):  # refused when asked, not at the next forward
            trimmed.set_swiftkv(False)


def test_snowflake_format_checkpoint_loads(tmp_path, teacher_dir):
    """A checkpoint written by hand in the published format (config keys + weight names) loads with
    every SwiftKV weight in place."""
    config = json.loads((teacher_dir / "config.json").read_text())
    base_type = config["model_type"]
    if base_type not in ("llama", "qwen2"):
        pytest.skip("Qwen3's branch layout: test_families; a Mistral source converts into llama_swiftkv")
    config.update(
        model_type=f"{base_type}_swiftkv",
        swiftkv=True,
        num_key_value_layers=N,
        key_value_group_size=G,
        architectures=[f"{'Llama' if base_type == 'llama' else 'Qwen2'}SwiftKVForCausalLM"],
    )
    tensors = dict(weights(teacher_dir))
    hidden, kv = config["hidden_size"], tensors["model.layers.0.self_attn.k_proj.weight"].shape[0]
    torch.manual_seed(3)
    tensors["model.norm_swiftkv.weight"] = torch.rand(hidden)
    for i in range(N, config["num_hidden_layers"]):
        tensors[f"model.layers.{i}.self_attn.q_proj_swiftkv.weight"] = torch.randn(hidden, hidden)
        if base_type == "qwen2":
            tensors[f"model.layers.{i}.self_attn.q_proj_swiftkv.bias"] = torch.randn(hidden)
        if (i - N) % G == 0:
            for name in ("k", "v"):
                tensors[f"model.layers.{i}.self_attn.{name}_proj_swiftkv.weight"] = torch.randn(kv, hidden)
                if base_type == "qwen2":
                    tensors[f"model.layers.{i}.self_attn.{name}_proj_swiftkv.bias"] = torch.randn(kv)
    folder = tmp_path / "snowflake"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    save_file(tensors, folder / "model.safetensors")
    model = AutoModelForCausalLM.from_pretrained(folder)
    loaded = model.state_dict()
    for name, tensor in tensors.items():
        if name != "lm_head.weight":
            assert torch.equal(loaded[name], tensor), name


# -- bad input ---------------------------------------------------------------------------------------


def cli(*args: str) -> int:
    return main(list(map(str, args)))


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("swiftkv convert: error: "), err
    return err


def convert_copy(src: Path, dst: Path, *extra: str) -> int:
    return cli(
        "convert",
        src,
        dst,
        "--num-key-value-layers",
        N,
        "--key-value-group-size",
        G,
        "--init",
        "copy",
        *extra,
    )


def assert_no_partial_output(dst: Path):
    assert not dst.exists()
    assert not [p for p in dst.parent.iterdir() if p.name.startswith(f".{dst.name}")]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--num-key-value-layers", "0"], "out of range"),
        (["--num-key-value-layers", "6"], "out of range"),
        (["--num-key-value-layers", "2", "--key-value-group-size", "3"], "does not divide"),
        (["--swiftkv-fraction", "1.5"], "out of range"),
    ],
)
def test_bad_geometry_gives_one_error(teacher_dir, tmp_path, calib_text, capsys, no_loading, args, message):
    dst = tmp_path / "out"
    assert cli("convert", teacher_dir, dst, *args, "--calib-data", calib_text) == 2
    assert message in one_error_line(capsys)
    assert_no_partial_output(dst)


def test_existing_destination_needs_force(teacher_dir, tmp_path, calib_text, capsys):
    dst = tmp_path / "out"
    dst.mkdir()
    (dst / "keep.txt").write_text("mine")
    assert cli("convert", teacher_dir, dst, "--num-key-value-layers", "2", "--calib-data", calib_text) == 2
    assert "already exists" in capsys.readouterr().err and (dst / "keep.txt").read_text() == "mine"


def test_unknown_architecture_and_missing_or_corrupt_weights(tmp_path, teacher_dir, capsys):
    gpt2 = tmp_path / "gpt2"
    gpt2.mkdir()
    (gpt2 / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    assert cli("convert", gpt2, tmp_path / "a", "--num-key-value-layers", "2") == 2
    assert "'gpt2' is not supported" in capsys.readouterr().err

    empty = tmp_path / "noweights"
    empty.mkdir()
    (empty / "config.json").write_text((teacher_dir / "config.json").read_text())
    assert cli("convert", empty, tmp_path / "b", "--num-key-value-layers", "2") == 2
    assert "no model weights" in capsys.readouterr().err

    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "config.json").write_text((teacher_dir / "config.json").read_text())
    (corrupt / "model.safetensors").write_bytes(b"\x00" * 100)
    # --init copy: with lstsq, the missing tokenizer is reported first, before the weights are read
    assert cli("convert", corrupt, tmp_path / "c", "--num-key-value-layers", "2", "--init", "copy") == 2
    assert "cannot load the weights" in capsys.readouterr().err
    for name in "abc":
        assert_no_partial_output(tmp_path / name)


def test_gguf_of_unsupported_architecture(tmp_path, capsys):
    import gguf

    path = tmp_path / "tiny-gpt2.gguf"
    writer = gguf.GGUFWriter(str(path), "gpt2")
    writer.add_tensor("token_embd.weight", torch.zeros(4, 4).numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert cli("convert", path, tmp_path / "out", "--num-key-value-layers", "2") == 2
    assert "GGUF architecture 'gpt2' is not supported" in capsys.readouterr().err
    assert_no_partial_output(tmp_path / "out")


def test_unknown_source_lists_aliases(tmp_path, capsys):
    assert cli("convert", tmp_path / "nope", tmp_path / "out", "--num-key-value-layers", "2") == 2
    assert "smollm2-135m-instruct" in capsys.readouterr().err


def test_loading_without_import_asks_for_swiftkv_code(teacher_dir, tmp_path, calib_text):
    """Without `import swiftkv`, transformers refuses with a pointer to the checkpoint's code; with
    trust_remote_code=True the folder's shim loads the swiftkv classes."""
    run_convert(teacher_dir, tmp_path / "out", calib_text)
    load = (
        f"from transformers import AutoModelForCausalLM as A; m = A.from_pretrained({str(tmp_path / 'out')!r}"
    )
    refused = subprocess.run([sys.executable, "-c", load + ")"], capture_output=True, text=True)
    assert refused.returncode != 0 and "trust_remote_code=True" in refused.stderr
    loaded = subprocess.run(
        [sys.executable, "-c", load + ", trust_remote_code=True); print(type(m).__name__)"],
        capture_output=True,
        text=True,
    )
    assert loaded.returncode == 0 and loaded.stdout.strip().endswith("SwiftKVForCausalLM")


def test_generate_command_streams_the_greedy_answer(tmp_path, calib_text, capsys):
    from swiftkv.generation import chat_input_ids, generate_text
    from swiftkv.sources import load_model, load_tokenizer

    out = tmp_path / "out"
    # This seed's random Llama does not emit end-of-turn first, so there is text to compare.
    run_convert(save_tiny_teacher(tmp_path / "teacher", "llama"), out, calib_text)
    capsys.readouterr()
    assert cli("generate", out, "the capital of france", "--max-new-tokens", "6", "--dtype", "float32") == 0
    streamed = capsys.readouterr().out
    tokenizer = load_tokenizer(out)
    expected = generate_text(
        load_model(out), tokenizer, chat_input_ids(tokenizer, "the capital of france"), 6
    )
    assert streamed.strip() == expected.strip() and expected.strip()


def test_trimmed_folder_tells_readers_it_is_student_only(llama_dir, tmp_path):
    assert convert_copy(llama_dir, tmp_path / "trim", "--no-measure", "--trim") == 0
    assert json.loads((tmp_path / "trim" / "config.json").read_text())["swiftkv_trimmed"] is True
    readme = (tmp_path / "trim" / "README.md").read_text()
    assert "Student-only" in readme and "ArcticTraining" in readme and "random weights" in readme
    assert (
        f"swiftkv convert {llama_dir} DST --num-key-value-layers {N} --key-value-group-size {G} --init copy`"
        in readme
    )
    assert convert_copy(llama_dir, tmp_path / "full", "--no-measure") == 0
    assert not (tmp_path / "full" / "README.md").exists()


def test_copy_init_needs_no_tokenizer_or_calibration_data(tmp_path, capsys):
    """A plain folder without tokenizer files converts with --init copy (the calibration is skipped
    with one note), and the written student computes exactly the copy init."""
    from swiftkv.model.surgery import build_swiftkv_model, copy_init_params, load_trained
    from swiftkv.sources import has_tokenizer

    source = save_tiny_teacher(tmp_path / "plain", "llama")
    for path in source.iterdir():
        if path.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            path.unlink()
    assert not has_tokenizer(source)
    assert convert_copy(source, tmp_path / "out") == 0
    out = capsys.readouterr().out
    assert out.count("note:") == 1 and "has no tokenizer" in out
    assert not has_tokenizer(tmp_path / "out")
    expected = build_swiftkv_model(AutoModelForCausalLM.from_pretrained(source), N, G)
    load_trained(expected, copy_init_params(expected))
    written = AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    x = torch.randint(4, 100, (1, 16))
    with torch.no_grad():
        assert torch.equal(written(x).logits, expected(x).logits)


@pytest.mark.parametrize(
    "args, note",
    [
        (["--no-measure"], "--no-measure was given"),
        (["--calib-data", "/nowhere/calib.jsonl"], "/nowhere/calib.jsonl"),
    ],
)
def test_copy_init_skips_calibration_with_one_note(llama_dir, tmp_path, capsys, args, note):
    assert convert_copy(llama_dir, tmp_path / "out", *args) == 0
    out = capsys.readouterr().out
    assert out.count("note:") == 1 and note in out
    assert json.loads((tmp_path / "out" / "swiftkv_conversion.json").read_text())["unmeasured"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--dtype", "float33"], "--dtype 'float33' is unknown; expected one of"),
        (
            ["--init", "lstsq", "--no-measure"],
            "--init lstsq is fitted on calibration tokens, but --no-measure was given",
        ),
        (
            ["--init", "lstsq", "--calib-data", "/nowhere/calib.jsonl"],
            "--calib-data '/nowhere/calib.jsonl': no such file",
        ),
    ],
)
def test_bad_settings_fail_before_loading(llama_dir, tmp_path, capsys, no_loading, args, message):
    assert cli("convert", llama_dir, tmp_path / "out", "--num-key-value-layers", N, *args) == 2
    assert message in one_error_line(capsys)
    assert not list(tmp_path.iterdir())


def test_lstsq_without_tokenizer_fails_before_loading(tmp_path, capsys, no_loading):
    source = save_tiny_teacher(tmp_path / "plain", "llama")
    (source / "tokenizer.json").unlink()
    capsys.readouterr()
    assert cli("convert", source, tmp_path / "out", "--num-key-value-layers", N, "--init", "lstsq") == 2
    assert "--init lstsq is fitted on calibration tokens, but the source" in one_error_line(capsys)
    assert not (tmp_path / "out").exists()


def test_unknown_compute_dtype_fails_before_loading(llama_dir, tmp_path, capsys, no_loading):
    with pytest.raises(SystemExit) as exited:  # argparse's choices: one line, exit 2
        cli("convert", llama_dir, tmp_path / "out", "--num-key-value-layers", N, "--compute-dtype", "float33")
    assert exited.value.code == 2 and "invalid choice: 'float33'" in one_error_line(capsys)
    with pytest.raises(ValueError, match="--compute-dtype 'float33' is unknown"):  # the library checks it too
        convert(
            ConvertSettings(
                source=str(llama_dir), out=tmp_path / "out", num_key_value_layers=N, compute_dtype="float33"
            )
        )
    assert not list(tmp_path.iterdir())


def test_unwritable_output_fails_before_loading(llama_dir, tmp_path, capsys, no_loading, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("mine")
    assert cli("convert", llama_dir, blocker / "sub" / "out", "--num-key-value-layers", N) == 2
    assert f"{blocker} is a file; expected a folder" in one_error_line(capsys)
    assert blocker.read_text() == "mine"

    # Root writes anywhere whatever the mode, so the check is os.access's answer, faked here for one folder.
    locked = tmp_path / "locked"
    locked.mkdir()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != locked and real_access(path, mode))
    assert cli("convert", llama_dir, locked / "out", "--num-key-value-layers", N) == 2
    assert f"folder {locked} is not writable by this user" in one_error_line(capsys)
    assert not list(locked.iterdir())
