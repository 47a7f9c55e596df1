"""Atomic outputs and the cache: temp data of killed writers is removed, --force replaces a file,
and outputs get the umask's mode (not mkdtemp's private 0700)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from swiftkv.cli import main
from swiftkv.files import (
    TEMP_MARK,
    atomic_file,
    atomic_output_dir,
    cache_root,
    cached_folder,
    folder_fingerprint,
    portable_path,
)
from tests.tiny import save_tiny_teacher


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory) -> Path:
    return save_tiny_teacher(tmp_path_factory.mktemp("teacher-llama"), "llama")


def dead_pid() -> int:
    """The pid of a process that has exited, as a SIGKILLed writer's is."""
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


def leftover(folder: Path) -> Path:
    """A half-written temp folder, as a writer killed mid-write leaves it."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.safetensors").write_bytes(b"half")
    return folder


@contextlib.contextmanager
def umask(mask: int):
    previous = os.umask(mask)
    try:
        yield
    finally:
        os.umask(previous)


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def convert_copy(src: Path, dst: Path, *extra: str) -> int:
    return main(
        [
            "convert",
            str(src),
            str(dst),
            "--num-key-value-layers",
            "2",
            "--init",
            "copy",
            "--no-measure",
            *extra,
        ]
    )


def test_convert_removes_the_temps_of_killed_writers(llama_dir, tmp_path):
    dst = tmp_path / "out"
    killed = leftover(tmp_path / f".out{TEMP_MARK}{dead_pid()}-x1y2")
    killed_replace = leftover(tmp_path / f".out.old{TEMP_MARK}{dead_pid()}")
    running = leftover(tmp_path / f".out{TEMP_MARK}1-a3b4")  # pid 1 is alive
    assert convert_copy(llama_dir, dst) == 0
    assert not killed.exists() and not killed_replace.exists()
    assert running.exists(), "a live writer's temp folder must stay"
    assert (dst / "config.json").is_file()


def test_force_replaces_a_file_and_leaves_no_temp(llama_dir, tmp_path):
    dst = tmp_path / "out"
    dst.write_text("a file, not a model folder")
    assert convert_copy(llama_dir, dst, "--force") == 0
    assert (dst / "config.json").is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_converted_folder_has_the_umask_mode(llama_dir, tmp_path):
    with umask(0o022):
        assert convert_copy(llama_dir, tmp_path / "out") == 0
    assert mode(tmp_path / "out") == 0o755
    assert all(mode(p) == 0o644 for p in (tmp_path / "out").iterdir())


@pytest.mark.parametrize("mask", [0o022, 0o027])
def test_outputs_follow_the_umask(tmp_path, mask):
    with umask(mask):
        with atomic_output_dir(tmp_path / "out") as tmp:
            (tmp / "sub").mkdir()
            (tmp / "sub" / "weights.bin").write_text("w")
            os.chmod(tmp / "sub" / "weights.bin", 0o600)
    assert mode(tmp_path / "out") == mode(tmp_path / "out" / "sub") == 0o777 & ~mask
    assert mode(tmp_path / "out" / "sub" / "weights.bin") == 0o666 & ~mask


@pytest.mark.parametrize("mask", [0o022, 0o027])
def test_an_atomic_file_follows_the_umask_whatever_its_writer_gave_it(tmp_path, mask):
    """safetensors' save_file writes 0600: the shipped-tensor files came out unreadable by other accounts."""
    with umask(mask):
        with atomic_file(tmp_path / "swiftkv.safetensors") as tmp:
            tmp.write_bytes(b"tensors")
            os.chmod(tmp, 0o600)
    assert mode(tmp_path / "swiftkv.safetensors") == 0o666 & ~mask


def build_privately(out: Path) -> None:
    """A cache builder whose files come out private, as transformers' weight shards do (0600)."""
    with atomic_output_dir(out) as tmp:
        (tmp / "config.json").write_text("{}")
    os.chmod(out / "config.json", 0o600)


def test_cache_removes_the_temps_of_killed_builders_and_is_readable():
    key = "gguf-tiny-model.Q4_1-1234"  # the key form of a converted GGUF
    cache_root().mkdir(parents=True, exist_ok=True)
    killed = leftover(cache_root() / f".{key}{TEMP_MARK}{dead_pid()}-abcd" / key).parent
    with umask(0o022):
        path = cached_folder(key, build_privately)
    assert not killed.exists()
    assert mode(path) == 0o755 and mode(path / "config.json") == 0o644


def test_export_removes_the_temps_of_killed_writers(llama_dir, tmp_path):
    from swiftkv.sources import export

    killed = leftover(tmp_path / f".exported{TEMP_MARK}{dead_pid()}-abcd")
    with umask(0o022):
        export(str(llama_dir), tmp_path / "exported")
    assert not killed.exists() and mode(tmp_path / "exported") == 0o755
    assert mode(tmp_path / "exported" / "model.safetensors") == 0o644
    assert (tmp_path / "exported" / "model.safetensors").read_bytes() == (
        llama_dir / "model.safetensors"
    ).read_bytes()


KILL_AFTER = """
import os, signal, sys
import {module}
from swiftkv.cli import main

original = {module}.{function}

def then_die(*args, **kwargs):
    original(*args, **kwargs)                    # the data is in the temp folder...
    os.kill(os.getpid(), signal.SIGKILL)         # ...and the writer dies before the rename

{module}.{function} = then_die
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize(
    "command, module, function",
    [
        (
            ["convert", "SRC", "DST", "--num-key-value-layers", "3", "--init", "copy", "--no-measure"],
            "swiftkv.tensorfiles",
            "write_layout",
        ),
        (["export", "SRC", "DST"], "shutil", "copytree"),
    ],
)
def test_a_writer_killed_mid_write_leaves_no_output_and_a_rerun_cleans_up(
    llama_dir, tmp_path, command, module, function
):
    """A real SIGKILL of `swiftkv convert` / `swiftkv export` after its files reach the temp folder:
    no DST appears, and the next run of the same command succeeds and leaves no temp data behind."""
    import sys

    dst = tmp_path / "out" / "model"
    command = [{"SRC": str(llama_dir), "DST": str(dst)}.get(word, word) for word in command]
    script = KILL_AFTER.format(module=module, function=function)
    killed = subprocess.run([sys.executable, "-c", script, *command], capture_output=True, text=True)
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert not dst.exists()
    assert [p.name for p in dst.parent.iterdir() if TEMP_MARK in p.name]  # the killed writer's temp folder
    assert main(command) == 0
    assert (dst / "config.json").is_file()
    assert not [p.name for p in dst.parent.iterdir() if TEMP_MARK in p.name]


@pytest.mark.parametrize(
    "name, portable",
    [
        ("/home/ana/.cache/swiftkv/smollm2", "~/.cache/swiftkv/smollm2"),  # under the home folder
        ("/home/ana", "~"),
        ("/home/ana/swiftkv/runs/s1", "runs/s1"),  # under the current folder (itself under home)
        ("/home/ana/swiftkv", "."),
        ("/home/ana/swiftkv/../other/s1", "~/other/s1"),
        ("/scratch/tmp/heldout-x", "$TMPDIR/heldout-x"),  # under the temp folder
        ("/opt/models/llama", "/opt/models/llama"),  # elsewhere: as given
        ("runs/s1", "runs/s1"),  # relative, an alias, a Hub id: as given
        ("smollm2-135m-instruct-swiftkv50", "smollm2-135m-instruct-swiftkv50"),
        ("HuggingFaceTB/SmolLM2-135M-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct"),
    ],
)
def test_a_recorded_path_names_no_folder_of_this_machine(name, portable):
    places = {"cwd": Path("/home/ana/swiftkv"), "home": Path("/home/ana"), "temp": Path("/scratch/tmp")}
    assert portable_path(name, **places) == portable


def test_the_home_folder_names_a_path_when_the_current_folder_is_home_or_above_it():
    home = Path("/home/ana")
    for cwd in (home, Path("/home"), Path("/")):
        assert portable_path("/home/ana/sk", cwd=cwd, home=home, temp=Path("/tmp")) == "~/sk"
    assert portable_path("/home/bo/sk", cwd=Path("/"), home=home, temp=Path("/tmp")) == "/home/bo/sk"


def test_the_places_default_to_this_process(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert portable_path(str(tmp_path / "runs" / "s1")) == "runs/s1"
    assert portable_path(str(Path.home() / "sk")) == "~/sk"


def test_a_cached_build_made_again_keeps_its_fingerprint_and_another_folder_does_not(tmp_path, monkeypatch):
    """A result cache keyed by folder_fingerprint finds a rebuilt alias's results (the same bytes built again,
    later), while a folder outside the cache is still known by its weights' mtimes."""
    monkeypatch.setenv("SWIFTKV_CACHE", str(tmp_path / "cache"))

    def build(path: Path) -> None:
        path.mkdir()
        (path / "config.json").write_text('{"model_type": "llama"}')
        (path / "model.safetensors").write_bytes(b"weights")

    first = folder_fingerprint(cached_folder("m", build))
    shutil.rmtree(tmp_path / "cache" / "m")
    time.sleep(0.01)  # another mtime
    assert folder_fingerprint(cached_folder("m", build)) == first
    elsewhere = tmp_path / "mine"
    shutil.copytree(tmp_path / "cache" / "m", elsewhere)
    before = folder_fingerprint(elsewhere)
    os.utime(elsewhere / "model.safetensors", ns=(1, 1))
    assert folder_fingerprint(elsewhere) != before
