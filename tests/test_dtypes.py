"""dtype auto: bf16 only where the hardware runs it natively (CUDA, AVX512-BF16 or AMX) and, on a CPU,
measurably faster than fp32; else fp32."""

import pytest
import torch

from swiftkv import dtypes


@pytest.mark.parametrize(
    ("avx512_bf16", "amx", "speedup", "expected", "reason"),
    [
        (False, False, 0.2, torch.float32, "no native bf16"),  # Ice Lake: AVX-512 without BF16 emulates bf16
        (True, False, 2.0, torch.bfloat16, "native bf16"),
        (False, True, 4.0, torch.bfloat16, "native bf16"),
        (True, False, 0.3, torch.float32, "bf16 is native but measured 0.30x fp32"),  # the flag, yet slower
    ],
)
def test_auto_follows_the_cpu_capability(monkeypatch, avx512_bf16, amx, speedup, expected, reason):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    monkeypatch.setattr(dtypes, "cpu_bf16_speedup", lambda: speedup)
    assert dtypes.auto_dtype("cpu") == expected
    assert dtypes.resolve_dtype("auto") == expected and dtypes.resolve_dtype(None) == expected
    assert reason in dtypes.describe_choice("auto")


def test_the_bf16_measurement_is_stored_per_machine(monkeypatch, tmp_path):
    """Measured once per CPU model / torch / threads, so every stage on one machine chooses alike."""
    monkeypatch.setenv("SWIFTKV_CACHE", str(tmp_path))
    calls = []
    monkeypatch.setattr(dtypes, "measure_bf16_speedup", lambda: calls.append(1) or 0.5)
    dtypes.cpu_bf16_speedup.cache_clear()
    try:
        assert dtypes.cpu_bf16_speedup() == 0.5
        dtypes.cpu_bf16_speedup.cache_clear()
        assert dtypes.cpu_bf16_speedup() == 0.5 and calls == [1]  # the second process reads the file
        stored = (tmp_path / "bf16-speedup.json").read_text()
        assert f"{torch.get_num_threads()} threads" in stored and "0.5" in stored
    finally:
        dtypes.cpu_bf16_speedup.cache_clear()


def test_the_measurement_times_both_dtypes():
    assert dtypes.matmul_seconds(torch.float32, size=128, repeats=2) > 0
    # a ratio of two measured times; its range is the CPU's: an AVX2-only EPYC (2026-11-28) ran bf16
    # matmuls 90-160x slower than fp32 (0.006-0.011), an AMX Xeon 6x faster
    assert 0 < dtypes.measure_bf16_speedup(rounds=1) < 100


def test_cuda_uses_bf16_when_the_device_supports_it(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert dtypes.auto_dtype("cuda") == torch.bfloat16
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert dtypes.auto_dtype("cuda") == torch.float32


def test_explicit_dtype_overrides_and_bad_names_fail_clearly(monkeypatch):
    monkeypatch.setattr(dtypes, "cpu_bf16_speedup", lambda: 1.0)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    assert dtypes.resolve_dtype("bf16") == torch.bfloat16 and dtypes.resolve_dtype("float32") == torch.float32
    assert dtypes.describe_choice("bfloat16") == "dtype bfloat16 (as requested)"
    with pytest.raises(ValueError, match=r"--dtype 'half' is unknown; expected one of \['auto', "):
        dtypes.resolve_dtype("half")


def test_weight_routing_imports_without_vllm():
    """Checkpoint-name routing is plain Python: usable (and testable) where vLLM is not installed."""
    import subprocess
    import sys

    code = "import sys, swiftkv.vllm.weights as w; assert 'vllm' not in sys.modules; print(w.route.__name__)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stdout.strip() == "route", result.stderr[-2000:]
