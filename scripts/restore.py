"""Bring back a file that left the tree, from the commit that still holds it.

    python scripts/restore.py PATH [PATH ...]     # as listed in docs/artifacts.json
    python scripts/restore.py --all

Each entry of docs/artifacts.json names a path, the commit that still holds it, its sha256 and its size. The
blob is read from git history, its sha256 checked before anything is written, and the file written to a
temporary name beside its place and then renamed: a mismatch, a commit this clone lacks (a shallow clone)
or a path the manifest does not list is one error, and nothing is written. A file restored into the clone is
listed in its .git/info/exclude, so `git status` and commits leave it out.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = ROOT / "docs" / "artifacts.json"


class RestoreError(Exception):
    """A restore that cannot be done as the manifest says: nothing was written."""


def read_manifest(manifest: Path = MANIFEST) -> dict[str, dict]:
    """The manifest's entries by path."""
    return {entry["path"]: entry for entry in json.loads(manifest.read_text())["artifacts"]}


def blob(root: Path, commit: str, path: str) -> bytes:
    """The file `path` as `commit` holds it, from this clone's history."""
    found = subprocess.run(
        ["git", "-C", str(root), "cat-file", "-e", f"{commit}^{{commit}}"], capture_output=True
    )
    if found.returncode:
        raise RestoreError(
            f"commit {commit} is not in this clone (a shallow clone?); fetch the full history "
            f"(git fetch --unshallow) to restore {path}"
        )
    shown = subprocess.run(["git", "-C", str(root), "show", f"{commit}:{path}"], capture_output=True)
    if shown.returncode:
        raise RestoreError(f"commit {commit} holds no {path}: {shown.stderr.decode().strip()}")
    return shown.stdout


def restore(path: str, root: Path = ROOT, manifest: Path = MANIFEST, into: Path | None = None) -> Path:
    """Write `path` back from its commit in `root`'s history, under `into` (default: `root`, where it was);
    return where it was written."""
    entries = read_manifest(manifest)
    if path not in entries:
        raise RestoreError(f"{path} is not in {manifest.name}; it lists {len(entries)} artifacts")
    entry = entries[path]
    data = blob(root, entry["commit"], path)
    digest = hashlib.sha256(data).hexdigest()
    if digest != entry["sha256"] or len(data) != entry["bytes"]:
        raise RestoreError(
            f"{path} at {entry['commit'][:12]} has sha256 {digest} ({len(data):,} bytes); "
            f"the manifest expects {entry['sha256']} ({entry['bytes']:,} bytes)"
        )
    target = (into or root) / path
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.restoring")
    try:
        partial.write_bytes(data)
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    if into is None:
        exclude_locally(root, path)
    return target


def exclude_locally(root: Path, path: str) -> None:
    """List a restored `path` in the clone's own exclude file (.git/info/exclude, never committed), so it stays out
    of `git status` and of commits: it is in history already, and committing it again would undo its leaving."""
    found = subprocess.run(
        ["git", "-C", str(root), "rev-parse", "--git-path", "info/exclude"], capture_output=True, text=True
    )
    if found.returncode:
        return  # not a git checkout: nothing to keep it out of
    exclude = Path(found.stdout.strip())
    exclude = exclude if exclude.is_absolute() else root / exclude
    line = f"/{path}"
    listed = exclude.read_text().splitlines() if exclude.exists() else []
    if line not in listed:
        exclude.parent.mkdir(parents=True, exist_ok=True)
        with exclude.open("a") as handle:
            handle.write(f"{line}\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", help="paths as docs/artifacts.json lists them")
    parser.add_argument("--all", action="store_true", help="every artifact the manifest lists")
    args = parser.parse_args(argv)
    paths = sorted(read_manifest()) if args.all else args.paths
    if not paths:
        parser.error("name a PATH from docs/artifacts.json, or --all")
    try:
        for path in paths:
            print(f"restored {restore(path).relative_to(ROOT)}")
    except RestoreError as error:
        print(f"restore.py: error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
