"""scripts/restore.py: a file that left the tree comes back from the commit docs/artifacts.json names, only
when its sha256 matches, and never half-written; every entry's commit holds its file; the shipped students
rebuild from their restored parents."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import pytest
import torch
from safetensors import safe_open

from swiftkv.model.surgery import DELTA_FACTORS, read_trained, stored_deltas
from tests.restored import ENTRIES, ROOT, need_commit, restore, restored

STUDENTS = [entry for path, entry in ENTRIES.items() if path.endswith("-student/swiftkv.safetensors")]
SMALLEST = min(STUDENTS, key=lambda entry: entry["bytes"])
SOUP = ROOT / "scripts" / "study" / "distill" / "soup.py"  # the command the soups' cards give


def test_every_listed_artifact_has_left_the_tree_and_names_its_restore():
    """No listed file is tracked (one restored by hand may be on disk, untracked); each names its command."""
    tracked = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "--", *ENTRIES], capture_output=True, text=True, check=True
    ).stdout.split()
    assert tracked == []
    for path, entry in ENTRIES.items():
        assert entry["restore"] == f"python scripts/restore.py {path}"
        assert len(entry["sha256"]) == 64 and entry["bytes"] > 0


def test_every_entry_is_held_by_its_commit_with_its_sha256_and_size():
    """The manifest cannot rot: each entry's commit holds its path with the sha256 and size it lists (one
    `git cat-file --batch` reads them all)."""
    for commit in {entry["commit"] for entry in ENTRIES.values()}:
        need_commit(commit)
    names = "".join(f"{entry['commit']}:{path}\n" for path, entry in ENTRIES.items())
    batch = subprocess.Popen(
        ["git", "-C", str(ROOT), "cat-file", "--batch"], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    batch.stdin.write(names.encode())
    batch.stdin.close()
    held = {}
    for path in ENTRIES:
        header = batch.stdout.readline().decode().split()
        assert header[1] == "blob", f"{path}: {' '.join(header)}"
        data = batch.stdout.read(int(header[2]))
        batch.stdout.read(1)  # the newline after each blob
        held[path] = (hashlib.sha256(data).hexdigest(), len(data))
    assert batch.wait() == 0
    assert held == {path: (entry["sha256"], entry["bytes"]) for path, entry in ENTRIES.items()}


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
    # a file already where the artifact goes (another version of it) is left as it was, and no temp beside it
    (into / SMALLEST["path"]).parent.mkdir(parents=True)
    (into / SMALLEST["path"]).write_bytes(b"a local version")
    with pytest.raises(restore.RestoreError, match="the manifest expects 0000"):
        restore.restore(SMALLEST["path"], manifest=manifest, into=into)
    assert [p.read_bytes() for p in into.rglob("*") if p.is_file()] == [b"a local version"]


def test_a_missing_commit_or_an_unlisted_path_is_one_error(tmp_path):
    manifest = tmp_path / "artifacts.json"
    manifest.write_text(json.dumps({"artifacts": [{**SMALLEST, "commit": "f" * 40}]}))
    with pytest.raises(restore.RestoreError, match="is not in this clone"):
        restore.restore(SMALLEST["path"], manifest=manifest, into=tmp_path)
    with pytest.raises(restore.RestoreError, match="is not in artifacts.json"):
        restore.restore("docs/nothing.bin", manifest=manifest, into=tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["artifacts.json"]


def test_soup22_rebuilds_byte_identical_from_its_restored_parents(tmp_path):
    """soup22 (-swiftkv25 until 2026-12-05, and where the shipped one started) is the exact equal mean of two
    students whose weights left the tree: restored from history, soup.py (the command its card gives) writes
    its file byte for byte."""
    parents = [f"docs/distill-study/{name}-n22-student" for name in ("cpu17m", "anneal22")]
    soup22 = "docs/distill-study/soup22-n22-student"
    restored([f"{folder}/swiftkv.safetensors" for folder in (*parents, soup22)], tmp_path)
    for parent in parents:
        (tmp_path / parent / "swiftkv.json").write_bytes((ROOT / parent / "swiftkv.json").read_bytes())
    out = tmp_path / "soup"
    subprocess.run([sys.executable, str(SOUP), str(out), *(str(tmp_path / p) for p in parents)], check=True)
    assert (out / "swiftkv.safetensors").read_bytes() == (
        tmp_path / soup22 / "swiftkv.safetensors"
    ).read_bytes()
    assert (out / "swiftkv.json").read_bytes() == (ROOT / soup22 / "swiftkv.json").read_bytes()


def test_soup_long15_rebuilds_from_its_restored_parents(restored_study, tmp_path):
    """soup-long15 (-swiftkv50 until 2026-12-04, and where the shipped one started) is soup.py --rank 128 (its
    card's command) of two students whose weights left the tree. Restored, they rebuild it: swiftkv.json and every SwiftKV tensor byte for byte, each stored change
    delta_b @ delta_a to 1e-3 of its norm. Not the factors byte for byte: they are the change's leading singular
    vectors, whose float32 LAPACK SVD differs in its last bits (and in a vector's sign) with the CPU and the
    thread count, and bf16 then rounds some factors the other way (on one Xeon, 1 and 2 threads: 5e-4 of a
    change's norm). The bound still tells a wrong rebuild: the rank-128 truncation itself is 3e-3 of the exact
    mean, and either parent about 3e-2 from the mean."""
    parents = [restored_study / f"{name}-n15-student" for name in ("long15", "soup15more")]
    out = tmp_path / "soup"
    subprocess.run([sys.executable, str(SOUP), str(out), *map(str, parents), "--rank", "128"], check=True)
    shipped = restored_study / "soup-long15-n15-student"  # shipped as -swiftkv50 until 2026-12-04
    assert (out / "swiftkv.json").read_bytes() == (shipped / "swiftkv.json").read_bytes()
    (_, rebuilt), (_, tensors) = read_trained(out), read_trained(shipped)
    assert {n: (t.shape, t.dtype) for n, t in rebuilt.items()} == {
        n: (t.shape, t.dtype) for n, t in tensors.items()
    }
    factors = [name for name in tensors if name.endswith(DELTA_FACTORS)]
    assert factors and all(torch.equal(rebuilt[n], t) for n, t in tensors.items() if n not in factors)
    made, kept = stored_deltas(rebuilt), stored_deltas(tensors)
    worst = max(float((made[name] - change).norm() / change.norm()) for name, change in kept.items())
    assert worst < 1e-3, f"a rebuilt change is {worst:.1e} of its norm from the shipped one"


def test_a_file_restored_into_its_clone_stays_out_of_git_status(tmp_path):
    """A clone whose history holds a file that left the tree: the restored file is listed in the clone's own
    .git/info/exclude (once, however often it is restored), so `git status` does not offer it for a commit."""
    repo = tmp_path / "clone"
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "docs").mkdir()
    (repo / "docs" / "big.bin").write_bytes(b"weights")
    subprocess.run([*git, "add", "docs"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "add"], check=True)
    commit = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    subprocess.run([*git, "rm", "-q", "docs/big.bin"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "leave"], check=True)
    entry = {
        "path": "docs/big.bin",
        "commit": commit,
        "sha256": hashlib.sha256(b"weights").hexdigest(),
        "bytes": 7,
    }
    manifest = tmp_path / "artifacts.json"
    manifest.write_text(json.dumps({"artifacts": [entry]}))
    for _ in range(2):
        restore.restore("docs/big.bin", root=repo, manifest=manifest)
    assert (repo / "docs" / "big.bin").read_bytes() == b"weights"
    status = subprocess.run([*git, "status", "--porcelain"], capture_output=True, text=True).stdout
    assert status == ""
    assert (repo / ".git" / "info" / "exclude").read_text().splitlines().count("/docs/big.bin") == 1
