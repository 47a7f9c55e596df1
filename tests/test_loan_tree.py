"""What travels with each device call during a loan (swiftkv/loan/tree.py): the stash moves out exactly what
the box never reads, and unstash puts it back byte for byte."""

import subprocess
from pathlib import Path

import pytest

from swiftkv.loan.stage import MARGIN_MIB, TRANSFER_MIB
from swiftkv.loan.tree import MIB, checkout_files, stash, stays_behind, travelling_tree_mib, unstash

FILES = {  # path -> (bytes, stays behind during a loan)
    "src/swiftkv/model.py": (b"code" * 100, False),
    "src/swiftkv/weights/student/swiftkv.safetensors": (b"w" * 5000, True),
    "docs/distill-study/run-fulleval.json": (b"{}" * 2000, True),
    "docs/eval-full/report.png": (b"p" * 3000, True),
    "docs/history.md": (b"# history\n", True),
    "docs/distill-study/gpu_students.sh": (b"#!/bin/bash\n", False),
    "docs/bench/gpu_check.py": (b"print()\n", False),
    "tests/test_x.py": (b"def test(): pass\n", False),
}


@pytest.fixture
def checkout(tmp_path):
    root = tmp_path / "repo"
    for name, (data, _) in FILES.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    (root / ".gitignore").write_text(".devdata/\n")
    (root / ".devdata").mkdir()
    (root / ".devdata" / "part1.bin").write_bytes(b"x" * 9000)  # ignored: carried by name, never counted
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], cwd=root, check=True)
    subprocess.run([*git, "add", "-A"], cwd=root, check=True)
    subprocess.run([*git, "commit", "-qm", "x"], cwd=root, check=True)
    (root / "docs" / "new-record.json").write_bytes(b"n" * 700)  # untracked, not ignored: it travels
    return root


def test_stays_behind_is_weights_and_docs_records():
    for name, (_, behind) in FILES.items():
        assert stays_behind(Path(name)) is behind, name


def test_travelling_tree_counts_what_a_call_sends_less_the_stash(checkout):
    sent = {str(f) for f in checkout_files(checkout)}
    assert sent == set(FILES) | {".gitignore", "docs/new-record.json"}
    travelling = sum(len(d) for d, behind in FILES.values() if not behind) + len(".devdata/\n")
    assert travelling_tree_mib(checkout) == pytest.approx(travelling / MIB)


def test_stash_then_unstash_restores_every_file(checkout, tmp_path):
    before = {f: (checkout / f).read_bytes() for f in checkout_files(checkout)}
    to = tmp_path / "stash"
    moved = stash(checkout, to)
    assert {str(f) for f in moved} == {n for n, (_, b) in FILES.items() if b} | {"docs/new-record.json"}
    assert not any((checkout / f).exists() for f in moved)
    assert all(not stays_behind(f) for f in checkout_files(checkout))
    with pytest.raises(FileExistsError, match="unstash"):
        stash(checkout, to)
    unstash(checkout, to)
    assert {f: (checkout / f).read_bytes() for f in checkout_files(checkout)} == before
    assert not to.exists()


def test_unstash_never_overwrites_and_needs_a_stash(checkout, tmp_path):
    to = tmp_path / "stash"
    with pytest.raises(FileNotFoundError, match="swiftkv loan stash"):
        unstash(checkout, to)
    stash(checkout, to)
    (checkout / "docs" / "history.md").write_text("written during the loan\n")
    with pytest.raises(FileExistsError, match=r"docs/history\.md"):
        unstash(checkout, to)
    assert (to / "docs" / "history.md").read_bytes() == FILES["docs/history.md"][0]


def test_this_checkout_leaves_room_for_the_stage():
    """The students' stage (~102 MiB: the 94 MiB teacher tar, the prompts, blocks, replies and site) is cut
    into two parts, each beside the travelling tree: the tree must leave both parts that much."""
    room = 2 * (TRANSFER_MIB - MARGIN_MIB - travelling_tree_mib())
    assert room >= 110, f"{room:.1f} MiB left for the stage's two parts"
