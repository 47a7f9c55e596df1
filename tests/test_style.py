"""The code's format and lint rules hold everywhere (`ruff format` at 110 columns, `ruff check`): CI runs
the tests, so a change that breaks them does not land."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHECKED = ["src", "tests", "docs", "scripts"]


def ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args, *CHECKED], cwd=ROOT, capture_output=True, text=True
    )


def test_the_code_is_formatted_by_ruff_format():
    result = ruff("format", "--check")
    assert result.returncode == 0, (
        f"run `ruff format src tests docs scripts`:\n{result.stdout}{result.stderr}"
    )


def test_ruff_check_passes():
    result = ruff("check")
    assert result.returncode == 0, (
        f"`ruff check src tests docs scripts` fails:\n{result.stdout}{result.stderr}"
    )
