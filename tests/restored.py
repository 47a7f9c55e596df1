"""Files that left the tree (docs/artifacts.json), brought back for the tests that read them by
scripts/restore.py, the code a user runs: from the commit that holds each, its sha256 checked. A clone that
lacks those commits (a shallow one) skips the tests."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STUDY = "docs/distill-study"  # the study's records
STUDY_SCRIPTS = "scripts/study/distill"  # the scripts that read them (card.py, soup.py), which find them from their own path
# the unseen-work table, whose column of a student card.py renders
CARD_TABLE = "scripts/study/eval/unseen_table.py"


def load_restore():
    """scripts/restore.py as a module (a script, not a package module)."""
    spec = importlib.util.spec_from_file_location("restore", ROOT / "scripts" / "restore.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


restore = load_restore()
ENTRIES = restore.read_manifest()


def need_commit(commit: str) -> None:
    held = subprocess.run(
        ["git", "-C", str(ROOT), "cat-file", "-e", f"{commit}^{{commit}}"], capture_output=True
    )
    if held.returncode:
        pytest.skip(f"commit {commit} is not in this clone (shallow); the restore reads it from history")


def restored(paths: list[str], into: Path) -> list[Path]:
    """Each of `paths` (as the manifest lists them) restored under `into`, where it was in the tree."""
    for path in paths:
        need_commit(ENTRIES[path]["commit"])
    return [restore.restore(path, into=into) for path in paths]


def study_checkout(into: Path, paths: list[str]) -> Path:
    """docs/distill-study as it stood before `paths` left it, under `into`: its tracked files copied and `paths`
    restored beside them, and the study's scripts (and the table script card.py loads) copied to their place in
    the same checkout. Returns the copy's records folder: card.py and soup.py loaded from the copy (`study_script`;
    the checkout above them found from their own path) read the restored files where they read them before."""
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", STUDY, STUDY_SCRIPTS, CARD_TABLE],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    for name in listed:
        (into / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / name, into / name)
    restored(paths, into)
    return into / STUDY


def study_script(study: Path, name: str) -> Path:
    """The study's script `name` in the checkout whose records folder is `study` (a `study_checkout`)."""
    return study.parents[1] / STUDY_SCRIPTS / name


# What the model cards' renderings (tests/test_results.py, scripts/study/distill/card.py) and the rebuild of the
# shipped -swiftkv50 (tests/test_restore.py) read of the files that left the tree.
CARD_READS = [
    f"{STUDY}/{name}"
    for name in (
        # the continued card (cpu16m, N = 15): its chain's runs and the tensors it replaced
        "cpu8m-n15-distill.json",
        "cpu16m-n15-distill.json",
        "cpu16m-n15-fulleval.json",
        "final5-n15-fulleval.json",
        # the chain's card (cpu17m, N = 22) and the N = 22 soup's
        "cpu8m-n22-distill.json",
        "cpu12m-n22-distill.json",
        "cpu14m-n22-distill.json",
        "cpu17m-n22-distill.json",
        "cpu17m-n22-fulleval.json",
        "cpu8m-n22-fulleval.json",
        "soup22-n22-fulleval.json",
        # the N = 15 soup's card: cpu19m and the GPU loan's snapshot (its first shard, whose metadata holds the
        # progress the card reads: that it is a snapshot, its geometry and rank)
        "soup15-n15-fulleval.json",
        "cpu19m-n15-fulleval.json",
        "loan-h200-2026-11-27/n15/0.safetensors",
        # that soup trained on (soup15more), and the shipped -swiftkv50: its mean with its last stage
        "soup15more-n15-distill.json",
        "soup15more-n15-fulleval.json",
        "replies-every-ids.jsonl.xz",
        "soup-long15-n15-fulleval.json",
        "long15-n15-student/swiftkv.safetensors",
        "soup15more-n15-student/swiftkv.safetensors",
        # the shipped -swiftkv50 since 2026-12-04: that mean trained on by the long-QA study's mix run
        "soup-long15-n15-student/swiftkv.safetensors",
        # the shipped -swiftkv25 since 2026-12-05: soup22 trained on by the long-QA study's N = 22 mix run
        "soup22-n22-student/swiftkv.safetensors",
    )
]
