"""Tokenization once per run: under torchrun (2 gloo processes) process 0 tokenizes and packs, process 1
memory-maps its blocks (`swiftkv.distill.parallel.shared_blocks`). Both get exactly the blocks one process builds,
and process 1's host memory does not pay for the tokenization.

The bound: process 1's peak resident memory stays below process 0's plus 16 MiB (the two start alike,
importing the same modules, so their resting sizes differ by a few MiB), and what process 1 adds to its
resident memory is at most the size of the blocks it maps (it reads every page) plus 16 MiB, while
process 0 adds the tokenized documents and the packing's lists on top of that."""

import json
import os
import subprocess
import sys

import pytest

from swiftkv.distill.core.trainer import training_blocks
from swiftkv.distill.settings import DistillSettings
from tests.blocks_ranks import digest
from tests.tiny import byte_tokenizer, random_chats, write_jsonl

SLACK_MIB = 16


@pytest.mark.slow
def test_one_process_tokenizes_and_the_other_maps_the_same_blocks(tmp_path):
    data = write_jsonl(tmp_path / "chats.jsonl", random_chats(4000, seed=3, words=20))
    values = {
        "source": "unused",
        "data": str(data),
        "targets": "human",
        "seq_len": 512,
        "tokens": 2_000_000,
        "heldout_tokens": 16384,
        "batch_size": 2,
    }
    (tmp_path / "settings.json").write_text(json.dumps(values))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        "-m",
        "tests.blocks_ranks",
        str(tmp_path / "settings.json"),
        str(tmp_path),
    ]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=400)
    assert result.returncode == 0, result.stderr[-3000:]
    first, second = (json.loads((tmp_path / f"{rank}.json").read_text()) for rank in (0, 1))

    train, heldout = training_blocks(DistillSettings.of(**values), byte_tokenizer())
    assert first["train"] == second["train"] == digest(train)
    assert first["heldout"] == second["heldout"] == digest(heldout)
    assert not list(tmp_path.glob(".swiftkv-blocks-*"))  # the cache is gone after the start

    added = [r["peak_mib"] - r["before_mib"] for r in (first, second)]
    print(
        f"peak MiB {first['peak_mib']:.0f} / {second['peak_mib']:.0f}, added {added[0]:.1f} / {added[1]:.1f}, "
        f"blocks {first['blocks_mib']:.1f}"
    )
    assert second["peak_mib"] < first["peak_mib"] + SLACK_MIB
    assert added[1] <= second["blocks_mib"] + SLACK_MIB
    assert added[0] > added[1] + second["blocks_mib"]  # process 0 did the tokenizing, process 1 did not
