"""No doc or record names a folder of the machine it was written on.

Checked, each whole file: every text file under docs/ (docs, records and logs alike: any file that decodes as
UTF-8 and holds no NUL byte; images and compressed records are not read), README.md and every other markdown
file outside tests/ (the shipped students' cards), and every shell script of the repository; and the
docstrings and comments of every Python file under src/ and scripts/. Nothing is exempt.

A path is an absolute machine location: /work/..., /root/..., /home/<user>/..., /Users/<user>/...,
/tmp/<name>, /opt/<name> or a file:/// URL. A relative path, a URL's own path (https://host/tmp/x), a shell
variable ($HOME/sk, ${TMPDIR:-/tmp}), `~/...` and a path inside code (a string the program uses) pass.

A record names a place in its portable form, one rule per kind of place (the records of the machines that
ran the study were rewritten by these rules, and `swiftkv.files.portable_path` writes the first three as a
run records them):
- under the home folder: `~/...` (/root/.cache/swiftkv/x -> ~/.cache/swiftkv/x);
- in a checkout of the repository (the folder the commands ran from): relative to its root
  (/work/main/docs/distill-study/x -> docs/distill-study/x, /work/main/.venv/bin/python -> .venv/bin/python);
- in the temp folder: `$TMPDIR/...` (/tmp/heldout-x -> $TMPDIR/heldout-x; file:///tmp/x -> file://$TMPDIR/x);
- in the runs folder beside the checkout, where the study scripts run: `$RUNS/...`, their variable for it
  (/work/runs/soup15-w -> $RUNS/soup15-w).
"""

from __future__ import annotations

import ast
import io
import os
import re
import subprocess
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Starts where no word, path, URL or variable text runs into it (so docs/work/x and https://h/tmp/x pass).
MACHINE_PATH = re.compile(
    r"(?<![\w.~$}/])(?:/work/|/root/|/home/[A-Za-z_][\w.-]*/|/Users/[A-Za-z_][\w.-]*/|/tmp/\w|/opt/\w)"
    r"[^\s`'\")\]}]*"
    r"|file:///[^\s`'\")\]}]*"
)


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
    """A doc, a record or a script: every line of it is read (a file under docs/ only if it is text)."""
    top = name.split("/", 1)[0]
    return top == "docs" or (name.endswith(".md") and top != "tests") or name.endswith(".sh")


def is_python_checked(name: str) -> bool:
    return name.endswith(".py") and name.split("/", 1)[0] in ("src", "scripts")


def text_of(path: Path) -> str | None:
    """The file's text, or None for a binary file (a NUL byte, or bytes that are not UTF-8)."""
    data = path.read_bytes()
    if b"\0" in data:
        return None
    try:
        return data.decode()
    except UnicodeDecodeError:
        return None


def findings(names: list[str], root: Path) -> dict[str, list[str]]:
    """Each checked file's machine paths (other files are not read)."""
    found = {}
    for name in names:
        if is_whole_file_checked(name):
            prose = text_of(root / name)
        elif is_python_checked(name):
            prose = python_prose((root / name).read_text())
        else:
            continue
        paths = machine_paths(prose or "")
        if paths:
            found[name] = paths
    return found


def test_no_doc_script_or_docstring_names_a_machine_path():
    found = findings(repository_files(), ROOT)
    assert not found, (
        f"absolute machine paths (write them in their portable form, as this test's docstring says): {found}"
    )


def test_a_planted_path_is_found_in_each_kind_of_file(tmp_path):
    planted = {
        "README.md": "Run it from /work/main/runs.\n",
        "docs/guide.md": "see `file:///home/ana/notes.html`\n",
        "docs/deep/more.md": "cd /home/ana/swiftkv && make\n",
        "scripts/gpu/run.sh": "#!/bin/bash\nW=${W:-/root/sk}\n",
        "docs/bench/x.sh": "#!/bin/bash\ncp a /tmp/stash\n",
        "src/swiftkv/a.py": '"""Reads /opt/models/llama."""\nX = 1\n',
        "scripts/b.py": "x = 1  # written to /tmp/out first\n",
        "docs/c.py": 'OUT = "/Users/bo/data"  # under docs/, code is read too\n',
        # records: a JSON result, a log, an eval report, a card (in docs/ and a shipped one)
        "docs/bench/online.json": '{"log": "/work/runs/online-logs/00-baseline.log"}\n',
        "docs/bench/run.log": "[bench] starting baseline: /root/.cache/swiftkv/smollm2\n",
        "docs/eval-full/day/report.md": "- S1: `/work/runs/soup-long15-r128 (N=15)`\n",
        "src/swiftkv/weights/m/README.md": "`swiftkv loan run /root/sk`\n",
    }
    clean = {
        "docs/ok.md": "docs/work/x, https://example.org/tmp/x, $HOME/sk, ${TMPDIR:-/tmp}, ~/runs\n",
        "src/swiftkv/code.py": 'STASH = "/tmp/swiftkv-stash"  # the stash folder\n',  # code, not prose
        "tests/t.py": '"""A test may plant /work/x."""\n',  # tests are not checked
        "tests/data/card.md": "/work/main\n",
        "notes.txt": "/work/main\n",  # neither a doc, a record, a script nor checked Python
    }
    binary = {  # not text: an image, a compressed record
        "docs/bench/online.png": b"\x89PNG\r\n\x1a\n\0/work/main/docs",
        "docs/r.json.xz": b"\xfd7zXZ/work/main/docs\xff",
    }
    for name, text in {**planted, **clean}.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    for name, data in binary.items():
        (tmp_path / name).write_bytes(data)
    found = findings(sorted({**planted, **clean, **binary}), tmp_path)
    assert found == {
        "README.md": ["/work/main/runs"],
        "docs/guide.md": ["file:///home/ana/notes.html"],
        "docs/deep/more.md": ["/home/ana/swiftkv"],
        "scripts/gpu/run.sh": ["/root/sk"],
        "docs/bench/x.sh": ["/tmp/stash"],
        "src/swiftkv/a.py": ["/opt/models/llama"],
        "scripts/b.py": ["/tmp/out"],
        "docs/c.py": ["/Users/bo/data"],
        "docs/bench/online.json": ["/work/runs/online-logs/00-baseline.log"],
        "docs/bench/run.log": ["/root/.cache/swiftkv/smollm2"],
        "docs/eval-full/day/report.md": ["/work/runs/soup-long15-r128"],
        "src/swiftkv/weights/m/README.md": ["/root/sk"],
    }


@pytest.mark.parametrize(
    "machine, portable",
    [
        ("/root/.cache/swiftkv/smollm2", "~/.cache/swiftkv/smollm2"),  # the home folder
        ("/home/ana/sk", "~/sk"),
        ("/work/main/docs/distill-study/x", "docs/distill-study/x"),  # a checkout: relative to its root
        ("/work/main/.venv/bin/python3.11", ".venv/bin/python3.11"),
        ("/tmp/heldout-x", "$TMPDIR/heldout-x"),  # the temp folder
        ("file:///tmp/vllm_dist_1", "file://$TMPDIR/vllm_dist_1"),
        ("/work/runs/soup15-w", "$RUNS/soup15-w"),  # the runs folder beside the checkout
    ],
)
def test_each_rules_portable_form_passes_where_the_machine_path_does_not(machine, portable):
    for quoted in ("`{}`", '"{}"', "({})", "--init-from={}", "log {}\n"):
        assert machine_paths(quoted.format(machine)) == [machine]
        assert machine_paths(quoted.format(portable)) == []


def test_a_distill_summary_records_its_paths_portably():
    """distill.json's settings name --out, --init-from and the data as portable paths, never this machine's."""
    from swiftkv.distill.measure.summary import recorded_settings
    from swiftkv.distill.settings import settings_for

    settings = settings_for(
        "smollm2-135m-instruct",
        out=str(Path.cwd() / "out" / "skv"),
        init_from=str(Path.home() / "runs" / "earlier"),
        data=(str(Path.home() / "data" / "a.jsonl"), "sharegpt"),
    )
    recorded = recorded_settings(settings)
    assert recorded["out"] == "out/skv" and recorded["init_from"] == "~/runs/earlier"
    assert (
        recorded["data"] == ["~/data/a.jsonl", "sharegpt"] and recorded["source"] == "smollm2-135m-instruct"
    )
