"""scripts/restore.py: a file that left the tree comes back from the commit docs/artifacts.json names, only
when its sha256 matches, and never half-written."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors import safe_open

ROOT = Path(__file__).resolve().parents[1]


def load_restore():
    spec = importlib.util.spec_from_file_location("restore", ROOT / "scripts" / "restore.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


restore = load_restore()
ENTRIES = restore.read_manifest()
SMALLEST = min(ENTRIES.values(), key=lambda entry: entry["bytes"])


def need_commit(commit: str) -> None:
    held = subprocess.run(
        ["git", "-C", str(ROOT), "cat-file", "-e", f"{commit}^{{commit}}"], capture_output=True
    )
    if held.returncode:
        pytest.skip(f"commit {commit} is not in this clone (shallow); the restore reads it from history")


def test_every_listed_artifact_has_left_the_tree_and_names_its_restore():
    for path, entry in ENTRIES.items():
        assert not (ROOT / path).exists(), path
        assert entry["restore"] == f"python scripts/restore.py {path}"
        assert len(entry["sha256"]) == 64 and entry["bytes"] > 0


def test_a_removed_student_comes_back_with_its_sha256_and_loads(tmp_path):
    need_commit(SMALLEST["commit"])
    written = restore.restore(SMALLEST["path"], into=tmp_path)
    data = written.read_bytes()
    assert hashlib.sha256(data).hexdigest() == SMALLEST["sha256"] and len(data) == SMALLEST["bytes"]
    with safe_open(str(written), "pt") as tensors:
        assert "model.norm_swiftkv.weight" in set(tensors.keys())
    assert sorted(p.name for p in written.parent.iterdir()) == ["swiftkv.safetensors"]  # no temp left


def test_a_sha256_that_differs_writes_nothing(tmp_path):
    need_commit(SMALLEST["commit"])
    manifest = tmp_path / "artifacts.json"
    wrong = {**SMALLEST, "sha256": "0" * 64}
    manifest.write_text(json.dumps({"artifacts": [wrong]}))
    into = tmp_path / "tree"
    with pytest.raises(restore.RestoreError, match="the manifest expects 0000"):
        restore.restore(SMALLEST["path"], manifest=manifest, into=into)
    assert not into.exists() or not any(p.is_file() for p in into.rglob("*"))


def test_a_missing_commit_or_an_unlisted_path_is_one_error(tmp_path):
    manifest = tmp_path / "artifacts.json"
    manifest.write_text(json.dumps({"artifacts": [{**SMALLEST, "commit": "f" * 40}]}))
    with pytest.raises(restore.RestoreError, match="is not in this clone"):
        restore.restore(SMALLEST["path"], manifest=manifest, into=tmp_path)
    with pytest.raises(restore.RestoreError, match="is not in artifacts.json"):
        restore.restore("docs/nothing.bin", manifest=manifest, into=tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["artifacts.json"]


def test_the_shipped_n22_student_rebuilds_byte_identical_from_its_restored_parents(tmp_path):
    """-swiftkv25 is the exact equal mean of two students whose weights left the tree: restored from history,
    soup.py (the command its card gives) writes the shipped file byte for byte."""
    parents = [f"docs/distill-study/{name}-n22-student" for name in ("cpu17m", "anneal22")]
    for parent in parents:
        entry = ENTRIES[f"{parent}/swiftkv.safetensors"]
        need_commit(entry["commit"])
        restore.restore(entry["path"], into=tmp_path)
        (tmp_path / parent / "swiftkv.json").write_bytes((ROOT / parent / "swiftkv.json").read_bytes())
    out = tmp_path / "soup"
    soup = ROOT / "docs" / "distill-study" / "soup.py"
    subprocess.run([sys.executable, str(soup), str(out), *(str(tmp_path / p) for p in parents)], check=True)
    shipped = ROOT / "src" / "swiftkv" / "weights" / "smollm2-135m-instruct-swiftkv25"
    for name in ("swiftkv.safetensors", "swiftkv.json"):
        assert (out / name).read_bytes() == (shipped / name).read_bytes(), name
