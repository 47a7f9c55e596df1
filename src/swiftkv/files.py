"""Everything swiftkv writes goes through here: atomic files and folders (temp beside the target,
then rename), the cache, identities of model folders, and cleanup of temp data left by dead runs.

Readers never see a half-written output: a crash or a kill leaves the previous version (or
nothing), plus at most a temp file whose name starts with "." and contains ".tmp-"; the next write
to the same place removes such leftovers when the process that made them is gone.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from .tensorfiles import stored_tensors

TEMP_MARK = ".tmp-"
_TEMP_PID = re.compile(r"\.tmp-(\d+)")


def cache_root() -> Path:
    """The swiftkv cache (converted GGUFs, rebuilt aliases, eval results, teacher replies)."""
    return Path(os.environ.get("SWIFTKV_CACHE", Path.home() / ".cache" / "swiftkv"))


def portable_path(
    name: str, cwd: Path | None = None, home: Path | None = None, temp: Path | None = None
) -> str:
    """`name` as a record writes it, naming the same place on another machine and no folder of this one: an
    absolute path under the current folder relative to it, under the temp folder as `$TMPDIR/...`, under the
    home folder as `~/...` (the innermost of these that holds it, the home folder before a current folder that is
    the same); anything else (a relative path, an alias, a Hub id, another absolute path) as given.
    `cwd`, `home` and `temp` default to this process's."""
    if not os.path.isabs(name):
        return name
    path = Path(os.path.normpath(name))
    home = Path(home or Path.home())
    places = [(home, "~"), (Path(temp or tempfile.gettempdir()), "$TMPDIR"), (Path(cwd or Path.cwd()), "")]
    holding = [
        (folder, mark)
        for folder, mark in places
        if folder != Path(folder.anchor)  # a folder that holds everything says nothing
        and path.is_relative_to(folder)
        and not (mark == "" and home.is_relative_to(folder))  # a current folder above home: home names it
    ]
    if not holding:
        return name
    folder, mark = max(holding, key=lambda held: len(held[0].parts))
    inside = path.relative_to(folder).as_posix()
    if not mark:
        return inside
    return mark if inside == "." else f"{mark}/{inside}"


def check_new_output(path: str | os.PathLike, force: bool, what: str = "output folder") -> Path:
    """Refuse, before any long work starts, to clobber an existing output unless --force, and an
    output that cannot be written: its nearest existing ancestor must be a folder we may add to."""
    path = Path(path)
    if path.exists() and not force:
        raise FileExistsError(f"{what} {path} already exists; pass --force to overwrite it")
    ancestor = path.absolute().parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise NotADirectoryError(f"cannot write {what} {path}: {ancestor} is a file; expected a folder")
    # os.access, not a trial write: it answers for this user (root may write anywhere, others not).
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise PermissionError(f"cannot write {what} {path}: folder {ancestor} is not writable by this user")
    return path


# --------------------------------------------------------------------------------------------------
# Atomic outputs
# --------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def atomic_output_dir(dst: str | os.PathLike, force: bool = False) -> Iterator[Path]:
    """Yield a temp folder beside `dst`; on success it becomes `dst`, on error it disappears.
    Readers never see a half-written `dst`, and an existing `dst` survives a failed overwrite."""
    dst = check_new_output(dst, force)
    dst.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(dst)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}{TEMP_MARK}{os.getpid()}-", dir=dst.parent))
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    give_umask_modes(tmp)
    replace_dir(tmp, dst)


def give_umask_modes(root: Path) -> None:
    """Give `root` and everything in it the modes mkdir and open give under the umask. mkdtemp makes
    a folder private (0700) and transformers writes its weight shards 0600, but another account
    (e.g. the one serving the model) must be able to read what this one wrote."""
    umask = os.umask(0)
    os.umask(umask)
    for path in [root, *root.rglob("*")] if root.is_dir() else [root]:
        if not path.is_symlink():
            os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~umask)


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temp path beside `path` (same suffix, so writers that infer the format still work);
    it replaces `path` on success and is removed on error, so `path` is never half-written. The file
    gets the umask's mode, whatever mode its writer gave it (safetensors writes 0600)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(path)
    tmp = path.with_name(f".{path.stem}{TEMP_MARK}{os.getpid()}{path.suffix}")
    try:
        yield tmp
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    give_umask_modes(tmp)
    os.replace(tmp, path)


def write_atomic(path: str | os.PathLike, data: bytes | str) -> None:
    with atomic_file(path) as tmp:
        tmp.write_bytes(data.encode() if isinstance(data, str) else data)


def replace_dir(src: Path, dst: Path) -> None:
    """Rename `src` to `dst`, replacing an existing `dst` only after `src` is complete."""
    old = None
    if dst.exists():
        old = dst.with_name(f".{dst.name}.old{TEMP_MARK}{os.getpid()}")
        dst.rename(old)
    src.rename(dst)
    if old is not None:
        remove(old)


def remove_stale_temps(target: Path) -> None:
    """Delete temp files/folders that earlier writes of `target` left when their process died."""
    for leftover in target.parent.glob(f".{target.stem}*{TEMP_MARK}*"):
        match = _TEMP_PID.search(leftover.name)
        if match and not process_alive(int(match.group(1))):
            remove(leftover)


def remove(path: Path) -> None:
    """Delete a file or a folder tree (an output being replaced may be either)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def process_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# --------------------------------------------------------------------------------------------------
# Cache and identities
# --------------------------------------------------------------------------------------------------


def cached_folder(key: str, build) -> Path:
    """A folder in the cache, built once by `build(path)` (which must create `path`). Concurrent
    builders each work in their own temp folder; the first rename wins, later ones are discarded."""
    path = cache_root() / key
    if (path / "config.json").is_file():
        return path
    cache_root().mkdir(parents=True, exist_ok=True)
    remove_stale_temps(path)
    with tempfile.TemporaryDirectory(prefix=f".{key}{TEMP_MARK}{os.getpid()}-", dir=cache_root()) as tmp:
        built = Path(tmp) / key
        build(built)
        give_umask_modes(built)
        content = files_digest(built)
        with contextlib.suppress(OSError):  # another process finished first: same content
            built.rename(path)
    write_atomic(built_digest_file(path), content + "\n")
    return path


def built_digest_file(path: Path) -> Path:
    """Where `cached_folder` keeps the digest of a folder it built: beside it, hidden."""
    return path.with_name(f".{path.name}.sha256")


def files_digest(folder: Path) -> str:
    """sha256 of every file in `folder`: its path within the folder and its bytes, in name order."""
    digest = hashlib.sha256()
    for file in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(file.relative_to(folder).as_posix().encode() + b"\0")
        with open(file, "rb") as handle:
            while block := handle.read(1 << 24):
                digest.update(block)
    return digest.hexdigest()


def folder_fingerprint(folder: Path) -> str:
    """Cheap identity of a model folder for result caches: its config plus, for a folder `cached_folder` built,
    the digest of its files taken when it was built (so the same build made again, in a cleared cache or on
    another machine, finds its results: the builds are byte for byte the same), for any other folder the name,
    size and mtime of every weight file (a re-conversion rewrites them, so stale results are never reused)."""
    digest = hashlib.sha256((folder / "config.json").read_bytes())
    built = built_digest_file(folder)
    if folder.parent.resolve() == cache_root().resolve() and built.is_file():
        digest.update(built.read_bytes())
        return digest.hexdigest()[:20]
    for weights in sorted([*folder.glob("*.safetensors"), *folder.glob("*.bin")]):
        stat = weights.stat()
        digest.update(f"{weights.name}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:20]


# Config keys that decide what a model computes (and which SwiftKV tensors it has).
GEOMETRY_KEYS = (
    "model_type",
    "num_hidden_layers",
    "num_key_value_layers",
    "key_value_group_size",
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "vocab_size",
)


def model_identity(folder: Path) -> dict:
    """What a model folder holds, wherever it lies (a checkpoint resumes on the same model given by
    another path, and not on another model put at the same path): its geometry from config.json
    and a digest of its tensors' names, shapes and dtypes. These come from the safetensors headers,
    so a 70B model costs a few KB of reading, not 140 GB."""
    config = json.loads((folder / "config.json").read_text())
    identity = {key: config.get(key) for key in GEOMETRY_KEYS}
    digest = hashlib.sha256()
    for weights in sorted(folder.glob("*.safetensors")):
        digest.update(json.dumps(stored_tensors(weights), sort_keys=True).encode())
    for weights in sorted(folder.glob("*.bin")):  # pickled: no header to read, the size stands in
        digest.update(f"{weights.name}:{weights.stat().st_size}".encode())
    identity["weights"] = digest.hexdigest()[:20]
    return identity
