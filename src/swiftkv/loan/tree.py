"""What a device call carries beside a stage part, and what stays behind during a loan.

Every call of the device tool sends the checkout (its tracked and untracked-not-ignored files) inside the
same 64 MiB as the part it carries. The box never reads the shipped weights (47 MB) nor the docs' records
(results JSON, plots, logs, committed replies: ~9.5 MB, and growing with every shipped student), so
`swiftkv loan stash` moves them out of the checkout before a loan and `swiftkv loan unstash` puts them
back. The docs' scripts (.sh, .py) stay: the box runs them.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

MIB = 2**20
ROOT = Path(__file__).resolve().parents[3]  # the checkout (src/swiftkv/loan/tree.py)
WEIGHTS_DIR = Path("src/swiftkv/weights")
TRAVELLING_DOCS = {".sh", ".py"}  # docs/ files the box runs
STASH_DIR = Path("/tmp/swiftkv-loan-stash")
STASH_LIST = "stashed.json"


def stays_behind(relative: Path) -> bool:
    """Whether a checkout file (relative to its root) is moved out during a loan."""
    in_docs = relative.parts[:1] == ("docs",)
    return WEIGHTS_DIR in relative.parents or (in_docs and relative.suffix not in TRAVELLING_DOCS)


def checkout_files(root: Path = ROOT) -> list[Path]:
    """The files a device call sends, relative to the root: tracked and untracked-not-ignored, present."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    return [Path(name.decode()) for name in listed if name and (root / name.decode()).is_file()]


def travelling_tree_mib(root: Path = ROOT) -> float:
    """MiB of what a call carries beside a part once the loan's stash has moved the rest out."""
    return sum((root / f).stat().st_size for f in checkout_files(root) if not stays_behind(f)) / MIB


def stash(root: Path = ROOT, to: Path = STASH_DIR) -> list[Path]:
    """Move what stays behind out of the checkout into `to`, keeping relative paths; returns them."""
    if (to / STASH_LIST).exists():
        raise FileExistsError(
            f"{to} already holds a stash ({STASH_LIST}); run `swiftkv loan unstash` before stashing again"
        )
    moved = [f for f in checkout_files(root) if stays_behind(f)]
    to.mkdir(parents=True, exist_ok=True)
    # The list first: an interrupted stash is still undone by unstash.
    (to / STASH_LIST).write_text(json.dumps([str(f) for f in moved], indent=1))
    for f in moved:
        (to / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.move(root / f, to / f)
    return moved


def unstash(root: Path = ROOT, frm: Path = STASH_DIR) -> list[Path]:
    """Put a stash back where it came from; a checkout file written since is never overwritten."""
    listing = frm / STASH_LIST
    if not listing.exists():
        raise FileNotFoundError(f"{listing} is missing: nothing was stashed (`swiftkv loan stash`)")
    stashed = [Path(name) for name in json.loads(listing.read_text())]
    clashes = [f for f in stashed if (frm / f).exists() and (root / f).exists()]
    if clashes:
        raise FileExistsError(
            f"{len(clashes)} stashed file(s) exist again in the checkout (first: {clashes[0]}); "
            f"move them aside, then unstash"
        )
    for f in stashed:
        if (frm / f).exists():  # absent: an interrupted stash had not moved it yet
            (root / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.move(frm / f, root / f)
    shutil.rmtree(frm)
    return stashed
