"""dtype auto: bf16 only where the hardware runs it natively (CUDA, AVX512-BF16 or AMX), else fp32."""

import pytest
import torch

from swiftkv import dtypes


@pytest.mark.parametrize(("avx512_bf16", "amx", "expected"), [
    (False, False, torch.float32),  # e.g. Ice Lake: AVX-512 without BF16 emulates bf16 (4.7x slower)
    (True, False, torch.bfloat16),
    (False, True, torch.bfloat16),
])
def test_auto_follows_the_cpu_capability(monkeypatch, avx512_bf16, amx, expected):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    assert dtypes.auto_dtype("cpu") == expected
    assert dtypes.resolve_dtype("auto") == expected and dtypes.resolve_dtype(None) == expected
    assert ("native bf16" if expected == torch.bfloat16 else "no native bf16") in dtypes.describe_choice("auto")


def test_cuda_uses_bf16_when_the_device_supports_it(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert dtypes.auto_dtype("cuda") == torch.bfloat16
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert dtypes.auto_dtype("cuda") == torch.float32


def test_explicit_dtype_overrides_and_bad_names_fail_clearly(monkeypatch):
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
