"""Tokenize once per run: under torchrun, the first process of each machine (LOCAL_RANK 0) tokenizes and
packs the run's blocks and writes them as .npy files (a temp folder renamed into place, so never read
half-written); every process then memory-maps them. The pages are the page cache's, shared by all the
processes of the machine, so host memory does not grow with the process count, and only one process spends
the time.

The others wait for the folder by polling the file system, not in a collective: tokenizing a real data set
takes minutes to an hour, and a collective waiting that long times out (NCCL's default is 10 minutes). A
poll has no such limit, and if the writing process dies torchrun ends the others. The folder's name holds a
token process 0 broadcasts first (a collective that returns at once), so a folder left by an earlier run is
never read. After every process has mapped the files, the writer removes the folder (the mappings stay
valid).
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from ...data.packing import Blocks
from .world import World, barrier

FIELDS = ("input_ids", "position_ids", "loss_mask")
POLL_SECONDS = 0.5
WAIT_LOG_SECONDS = 60  # a waiting process says so this often


def shared_blocks(build: Callable[[], tuple[Blocks, Blocks]], world: World, near: Path | None = None):
    """(train, held-out) blocks from `build`, called by one process per machine; memory-mapped by all.
    `near`: a folder whose file system holds the cache (default: the temp folder)."""
    if world.size == 1:
        return build()
    folder = (near or Path(tempfile.gettempdir())) / f".swiftkv-blocks-{run_token()}"
    writer = int(os.environ.get("LOCAL_RANK", "0")) == 0
    if writer:
        write_blocks(folder, build())
    else:
        wait_for(folder)
    blocks = mapped_blocks(folder, "train"), mapped_blocks(folder, "heldout")
    barrier(world)  # every process has mapped the files
    if writer:
        shutil.rmtree(folder, ignore_errors=True)
    return blocks


def run_token() -> str:
    """A name for this run's cache, the same in every process (process 0's, broadcast)."""
    token = [uuid.uuid4().hex]
    torch.distributed.broadcast_object_list(token, src=0)
    return token[0]


def write_blocks(folder: Path, blocks: tuple[Blocks, Blocks]) -> None:
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = folder.with_name(f"{folder.name}.tmp-{socket.gethostname()}-{os.getpid()}")
    tmp.mkdir()
    for part, packed in zip(("train", "heldout"), blocks, strict=True):
        for name in FIELDS:
            np.save(tmp / f"{part}-{name}.npy", getattr(packed, name).numpy())
    try:
        tmp.rename(folder)
    except OSError:  # another machine's writer on a shared file system was first: the same blocks
        shutil.rmtree(tmp, ignore_errors=True)


def wait_for(folder: Path) -> None:
    started = last_log = time.monotonic()
    while not folder.is_dir():
        time.sleep(POLL_SECONDS)
        if time.monotonic() - last_log > WAIT_LOG_SECONDS:
            last_log = time.monotonic()
            print(f"waiting for the first process's token blocks ({last_log - started:.0f} s)", flush=True)


def mapped_blocks(folder: Path, part: str) -> Blocks:
    """Blocks whose tensors are memory maps of the files (slices of them stay maps)."""
    tensors = []
    for name in FIELDS:
        # copy-on-write ("c"): writable as torch wants, private to the process, and shared until written
        # (nothing writes it)
        tensors.append(torch.from_numpy(np.load(folder / f"{part}-{name}.npy", mmap_mode="c")))
    return Blocks(*tensors)
