"""No doc names a folder of the machine it was written on.

Checked: README.md and every markdown file under docs/, every shell script of the repository (the whole
file), and the docstrings and comments of every Python file under src/, scripts/ and docs/. A path is an
absolute machine location: /work/..., /root/..., /home/<user>/..., /Users/<user>/..., /tmp/<name>,
/opt/<name> or a file:/// URL. A relative path, a URL's own path (https://host/tmp/x), a shell variable
($HOME/sk, ${TMPDIR:-/tmp}) and a path inside code (a string the program uses) are not docs and pass.
"""

from __future__ import annotations

import ast
import io
import os
import re
import subprocess
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Starts where no word, path, URL or variable text runs into it (so docs/work/x and https://h/tmp/x pass).
MACHINE_PATH = re.compile(
    r"(?<![\w.~$}/])(?:/work/|/root/|/home/[A-Za-z_][\w.-]*/|/Users/[A-Za-z_][\w.-]*/|/tmp/\w|/opt/\w)"
    r"[^\s`'\")\]}]*"
    r"|file:///[^\s`'\")\]}]*"
)

# Records written by the tools as they ran (an eval report names the folder it scored; a card generated from
# a run's records names the run's folder). They are outputs, compared byte for byte by their own tests, and
# leave the tree with the other artifacts; each exemption is one exact path in one file, so nothing new
# passes. The two GPU scripts are rewritten where they move (scripts/gpu/), which this test then checks.
RECORDED = {
    "docs/distill-study/loan-h200-2026-11-27/README.md": {"/root/sk"},
    "docs/distill-study/soup-long15-n15-student/README.md": {"/work/runs/soup-long15-r128", "/root/sk"},
    "docs/distill-study/soup15-n15-student/README.md": {"/work/runs/soup15-w", "/root/sk"},
    "docs/distill-study/soup15more-n15-student/README.md": {"/root/sk"},
    "docs/distill-study/soup22-n22-student/README.md": {"/work/runs/soup22-a"},
    "docs/eval-full/2026-11-29-soup-long15-n15/report.md": {"/work/runs/soup-long15-r128"},
    "docs/eval-full/2026-11-27-cpu17m-n22/report.md": {"/work/runs/cpu17m-n22-student"},
    "docs/eval-full/2026-11-28-cpu19m-n15/report.md": {"/work/main/docs/distill-study/cpu19m-n15-student"},
    "docs/eval-full/2026-11-28-soup15-n15/report.md": {"/work/runs/soup15-w"},
    "docs/eval-full/2026-11-28-soup15more-n15/report.md": {"/work/runs/soup15more-n15-student"},
    "docs/eval-full/2026-11-28-soup22-n22/report.md": {"/work/runs/soup22-a"},
    "docs/bench/gpu_check.sh": {"/root/gc"},
    "docs/distill-study/gpu_students.sh": {"/root/sk"},
}


def machine_paths(text: str) -> list[str]:
    return [m.group(0).rstrip(".,;:") for m in MACHINE_PATH.finditer(text)]


def python_prose(source: str) -> str:
    """The comments and docstrings of a Python file, one per line: the parts of it that are docs."""
    parts = [
        tok.string
        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
        if tok.type == tokenize.COMMENT
    ]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            parts.append(ast.get_docstring(node, clean=False) or "")
    return "\n".join(parts)


def repository_files() -> list[str]:
    """Tracked and untracked-but-not-ignored files, relative to the root (a walk where git is missing)."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.splitlines()
        return [name for name in listed if (ROOT / name).is_file()]
    except (OSError, subprocess.CalledProcessError):
        found = []
        for folder, subfolders, names in os.walk(ROOT):
            subfolders[:] = [d for d in subfolders if not d.startswith(".") and d != "__pycache__"]
            found += [str((Path(folder) / n).relative_to(ROOT)) for n in names]
        return found


def is_whole_file_checked(name: str) -> bool:
    return name == "README.md" or (name.startswith("docs/") and name.endswith(".md")) or name.endswith(".sh")


def is_python_checked(name: str) -> bool:
    return name.endswith(".py") and name.split("/", 1)[0] in ("src", "scripts", "docs")


def findings(names: list[str], root: Path) -> dict[str, list[str]]:
    """Each checked file's machine paths that no RECORDED exemption names (other files are not read)."""
    found = {}
    for name in names:
        if is_whole_file_checked(name):
            prose = (root / name).read_text(errors="replace")
        elif is_python_checked(name):
            prose = python_prose((root / name).read_text())
        else:
            continue
        paths = [p for p in machine_paths(prose) if p not in RECORDED.get(name, set())]
        if paths:
            found[name] = paths
    return found


def test_no_doc_script_or_docstring_names_a_machine_path():
    found = findings(repository_files(), ROOT)
    assert not found, f"absolute machine paths (write them relative, or as $HOME / a variable): {found}"


def test_a_planted_path_is_found_in_each_kind_of_file(tmp_path):
    planted = {
        "README.md": "Run it from /work/main/runs.\n",
        "docs/guide.md": "see `file:///home/ana/notes.html`\n",
        "docs/deep/more.md": "cd /home/ana/swiftkv && make\n",
        "scripts/gpu/run.sh": "#!/bin/bash\nW=${W:-/root/sk}\n",
        "docs/bench/x.sh": "#!/bin/bash\ncp a /tmp/stash\n",
        "src/swiftkv/a.py": '"""Reads /opt/models/llama."""\nX = 1\n',
        "scripts/b.py": "x = 1  # written to /tmp/out first\n",
        "docs/c.py": 'def f():\n    """From /Users/bo/data."""\n',
    }
    clean = {
        "docs/ok.md": "docs/work/x, https://example.org/tmp/x, $HOME/sk, ${TMPDIR:-/tmp}, ~/runs\n",
        "src/swiftkv/code.py": 'STASH = "/tmp/swiftkv-stash"  # the stash folder\n',  # code, not prose
        "tests/t.py": '"""A test may plant /work/x."""\n',  # tests are not checked
        "notes.txt": "/work/main\n",  # neither a doc, a script nor checked Python
    }
    for name, text in {**planted, **clean}.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    found = findings(sorted({**planted, **clean}), tmp_path)
    assert found == {
        "README.md": ["/work/main/runs"],
        "docs/guide.md": ["file:///home/ana/notes.html"],
        "docs/deep/more.md": ["/home/ana/swiftkv"],
        "scripts/gpu/run.sh": ["/root/sk"],
        "docs/bench/x.sh": ["/tmp/stash"],
        "src/swiftkv/a.py": ["/opt/models/llama"],
        "scripts/b.py": ["/tmp/out"],
        "docs/c.py": ["/Users/bo/data"],
    }


def test_an_exemption_covers_only_its_own_path_in_its_own_file(tmp_path):
    name = "docs/eval-full/2026-11-29-soup-long15-n15/report.md"
    (tmp_path / name).parent.mkdir(parents=True)
    (tmp_path / name).write_text("- S1: `/work/runs/soup-long15-r128 (N=15)`\n- S2: `/work/runs/other`\n")
    (tmp_path / "docs/other.md").write_text("`/work/runs/soup-long15-r128`\n")
    found = findings([name, "docs/other.md"], tmp_path)
    assert found == {name: ["/work/runs/other"], "docs/other.md": ["/work/runs/soup-long15-r128"]}
