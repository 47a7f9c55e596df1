"""The GPU serving check (scripts/gpu/gpu_check.py, gpu_check.sh): its CPU dry-run is the same driver a GPU
runs, on vLLM's CPU engine, so a GPU run starts with a script that already ran end to end; its import check,
missing-file errors and output limits."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from swiftkv.vllm.kv_dtype import cpu_has_fp8_kernels

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu" / "gpu_check.py"
sys.path.insert(0, str(SCRIPT.parent))

from outputs import MAX_FILE_BYTES, MAX_FILES, output_problems  # noqa: E402


@pytest.mark.vllm
@pytest.mark.timeout(1200)
def test_dry_run_serves_every_case_as_the_hf_model_and_reports_capacity(tmp_path):
    result = subprocess.run(
        ["bash", str(SCRIPT.with_name("gpu_check.sh")), "run"],
        env={**os.environ, "DRY": "1", "PYTHON": sys.executable, "OUT": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=1100,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    # What the run leaves is what a GPU run brings back: the report and the table, no model folders.
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["gpu-check.json", "gpu-check.md"]
    report = json.loads((tmp_path / "gpu-check.json").read_text())
    cases = {case["case"]: case for case in report["cases"]}
    assert set(cases) == {
        "llama-g1 default eager",
        "llama-g2 default eager",
        "qwen3-g1 default eager",
        "llama-g1 fp8 kv",
        "llama-g1 ngram",
    }
    table = (tmp_path / "gpu-check.md").read_text()
    fp8 = cases["llama-g1 fp8 kv"]
    # run where this CPU has vLLM's fp8 kernels; elsewhere reported as skipped, with the reason, and not run
    no_kernels = "vLLM-CPU's fp8 KV kernels need AVX-512 or AMX"
    assert fp8["skipped"] == (None if cpu_has_fp8_kernels() else no_kernels)
    if fp8["skipped"]:
        assert fp8["prompts"] == 0 and f"| llama-g1 fp8 kv | skipped: {no_kernels} |" in table
    for case in (case for case in cases.values() if not case["skipped"]):
        assert case["error"] is None and case["prompts"] == 8, case
        assert case["identical"] or not case["exact"], (
            case
        )  # fp8 reports its kept tokens; the rest must equal HF
        assert case["cached_tokens"] >= 256  # the shared prefix came from the prefix cache
    # 2 early + 4 later layers: 6 caches at G = 1, 4 at G = 2 (block rounding aside)
    assert 1.45 < report["capacity_g2_vs_g1"]["ratio"] < 1.6
    if not fp8["skipped"]:
        assert fp8["kv_cache_tokens"] > 3.5 * cases["llama-g1 default eager"]["kv_cache_tokens"]
    assert table.count("\n") == 2 + len(cases) and "| llama-g1 ngram | yes |" in table


@pytest.mark.vllm
def test_without_a_gpu_the_check_asks_for_the_dry_run(tmp_path):
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path)], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 2 and "no GPU here; pass --dry-run" in result.stderr


def test_without_vllm_the_check_names_the_failed_import_and_runs_no_case(tmp_path):
    shadow = tmp_path / "shadow" / "vllm"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('no vLLM build for this machine')\n")
    env = {**os.environ, "PYTHONPATH": f"{shadow.parent}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--dry-run", "--out", str(tmp_path / "out")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 3, result.stderr[-2000:]
    assert result.stderr.strip() == (
        "gpu_check.py: `from vllm import LLM` failed (ImportError: no vLLM build for this machine); nothing ran"
    )
    assert not (tmp_path / "out").exists()


def test_the_shell_steps_without_their_staged_files_name_the_step_that_writes_them(tmp_path):
    script = SCRIPT.with_name("gpu_check.sh")
    for step, missing, writer in (
        ("unpack1", ".devdata/gc1/vllm-py.tar.xz", "gpu_check.sh stage (part 1)"),
        ("unpack2-and-run", ".devdata/gc2/c.so.xz", "gpu_check.sh stage (part 2)"),
    ):
        result = subprocess.run(
            ["bash", str(script), step],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
            env={"PATH": "/usr/bin:/bin", "W": str(tmp_path / "work")},
        )
        assert result.returncode == 2, result.stderr
        assert result.stderr.strip() == f"gpu_check.sh: {missing} is missing; it is written by '{writer}'"


def test_the_output_limits_name_every_file_that_would_not_come_back(tmp_path):
    for index in range(MAX_FILES):
        (tmp_path / f"{index}.json").write_text("{}")
    assert output_problems(tmp_path) == []
    deep = tmp_path / "a" / "b" / "c"
    deep.mkdir(parents=True)
    (deep / "x.bin").write_bytes(b"")
    (tmp_path / "a" / "big.bin").write_bytes(b"\0" * (MAX_FILE_BYTES + 1))
    assert output_problems(tmp_path) == [
        f"{MAX_FILES + 2} files, more than {MAX_FILES}",
        "a/b/c/x.bin: 3 folders deep, more than 2",
        f"a/big.bin: {MAX_FILE_BYTES + 1:,} bytes, more than {MAX_FILE_BYTES:,}",
    ]
