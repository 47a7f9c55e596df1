"""`python -m loan stage|run|install|replies` (from scripts/gpu; `commands.py` has the steps). What the steps
import is checked first: a missing package is named, with exit code 3, before anything runs."""

from __future__ import annotations

import sys

from outputs import check_imports

NEEDED = [
    ("torch", None),
    ("transformers", None),
    ("safetensors", "safe_open"),
    ("numpy", None),
    ("swiftkv.distill.core.trainer", "train_step"),
]


def main(argv: list[str] | None = None) -> int:
    if code := check_imports("python -m loan", NEEDED):
        return code
    from .commands import main as run_step

    return run_step(argv)


if __name__ == "__main__":
    sys.exit(main())
