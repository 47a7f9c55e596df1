"""Shared test settings: offline hub, a private swiftkv cache, one torch thread per test."""

import os
import shutil
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

DEFAULT_THREADS = torch.get_num_threads()


@pytest.fixture(scope="session", autouse=True)
def swiftkv_cache():
    """The swiftkv cache (`swiftkv.files.cache_root()`, read from SWIFTKV_CACHE, inherited by the
    subprocesses tests start) is a temp folder of this session, removed at its end: tests never read
    or write the user's ~/.cache/swiftkv. The slow tests export the real SmolLM2 into it from its
    wheel on first use (about 20 s per session)."""
    folder = Path(tempfile.mkdtemp(prefix="swiftkv-test-cache-"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SWIFTKV_CACHE", str(folder))
        yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """One torch thread per test: the machines have 2 cores shared with other jobs, and OpenMP
    threads spinning against them make the small matmuls of these tests several times slower.
    vLLM tests keep torch's default (the CPU engine binds its own threads); OMP_NUM_THREADS, where
    set, wins everywhere."""
    if "OMP_NUM_THREADS" in os.environ:
        return
    wanted = DEFAULT_THREADS if item.get_closest_marker("vllm") else 1
    if torch.get_num_threads() != wanted:
        torch.set_num_threads(wanted)


@pytest.fixture(scope="session")
def restored_study(tmp_path_factory):
    """A copy of docs/distill-study with what the model cards read of the files that left the tree restored
    (tests/restored.py): built once a session, as it takes seconds and ~120 MB."""
    from tests.restored import CARD_READS, study_checkout

    return study_checkout(tmp_path_factory.mktemp("checkout"), CARD_READS)
