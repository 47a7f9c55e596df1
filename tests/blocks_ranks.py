"""Each process of a torchrun group takes the run's blocks the way `distill` does (`shared_blocks`: one
process tokenizes, all memory-map) and records its host memory, for tests/test_shared_blocks.py:
`python -m tests.blocks_ranks SETTINGS.json OUT`.

Every process reads every page of its blocks (a sum over them), so a mapped file counts in its resident
memory as fully as a tensor it built would; OUT/<rank>.json holds the resident MiB before, the peak after,
and a digest of the blocks.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import torch

from swiftkv.distill.core.trainer import training_blocks
from swiftkv.distill.parallel.shared_blocks import shared_blocks
from swiftkv.distill.parallel.world import init_world
from swiftkv.distill.settings import DistillSettings
from swiftkv.hostmemory import peak_mib, reset_peak
from tests.tiny import byte_tokenizer


def digest(blocks) -> str:
    sha = hashlib.sha256()
    for tensor in (blocks.input_ids, blocks.position_ids, blocks.loss_mask):
        sha.update(tensor.contiguous().numpy().tobytes())
    return sha.hexdigest()


def main(settings_json: str, out: str) -> None:
    settings = DistillSettings.of(**json.loads(Path(settings_json).read_text()))
    tokenizer = byte_tokenizer()
    world = init_world()
    before = reset_peak()
    train, heldout = shared_blocks(lambda: training_blocks(settings, tokenizer), world, Path(out))
    # every page read, by reductions that make no converted copy (a bool sum would widen the mask to int64)
    read = [
        int(t.view(torch.uint8).sum(dtype=torch.uint8)) for b in (train, heldout) for t in vars(b).values()
    ]
    record = {
        "rank": world.rank,
        "before_mib": before,
        "peak_mib": peak_mib(),
        "blocks_mib": sum(t.numel() * t.element_size() for b in (train, heldout) for t in vars(b).values())
        / 2**20,
        "train": digest(train),
        "heldout": digest(heldout),
        "read": read,
    }
    (Path(out) / f"{world.rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main(*sys.argv[1:])
