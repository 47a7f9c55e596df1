"""What a GPU script may leave in its output folder: the runner these scripts were written for brings back
at most MAX_FILES files of at most MAX_FILE_BYTES each, no deeper than MAX_FOLDERS folders under the
output folder (settings of that runner, not of swiftkv). Each script checks its folder when it ends and
exits non-zero (EXIT_OUTPUTS) naming every file that would not come back, so a breach fails the dry-run
here rather than a run there."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

MAX_FILES = 8
MAX_FILE_BYTES = 16 * 2**20
MAX_FOLDERS = 2
EXIT_IMPORTS = 3  # an import the script needs failed: nothing ran
EXIT_OUTPUTS = 4  # the output folder breaks the limits above


def output_problems(out: Path) -> list[str]:
    """Each way the files under `out` break the limits, said; empty when none does."""
    files = sorted(p for p in Path(out).rglob("*") if p.is_file())
    problems = [f"{len(files)} files, more than {MAX_FILES}"] if len(files) > MAX_FILES else []
    for path in files:
        relative = path.relative_to(out)
        if path.stat().st_size > MAX_FILE_BYTES:
            problems.append(f"{relative}: {path.stat().st_size:,} bytes, more than {MAX_FILE_BYTES:,}")
        if len(relative.parts) - 1 > MAX_FOLDERS:
            problems.append(f"{relative}: {len(relative.parts) - 1} folders deep, more than {MAX_FOLDERS}")
    return problems


def check_outputs(out: Path, script: str) -> int:
    """0, or EXIT_OUTPUTS with every problem of `out` printed on stderr."""
    problems = output_problems(out)
    for problem in problems:
        print(f"{script}: output {out}: {problem}", file=sys.stderr)
    return EXIT_OUTPUTS if problems else 0


def check_imports(script: str, needed: list[tuple[str, str | None]]) -> int:
    """0, or EXIT_IMPORTS after naming the first of `needed` ((module, name in it or None)) that does not
    import, and why: checked before any case runs."""
    for module, name in needed:
        statement = f"from {module} import {name}" if name else f"import {module}"
        try:
            imported = importlib.import_module(module)
            if name:
                getattr(imported, name)
        except Exception as error:  # noqa: BLE001 - any failure to import is the one reported
            print(
                f"{script}: `{statement}` failed ({type(error).__name__}: {error}); nothing ran",
                file=sys.stderr,
            )
            return EXIT_IMPORTS
    return 0
