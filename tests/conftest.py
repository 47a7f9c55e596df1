"""Shared test settings: offline hub, deterministic torch, few threads per test process."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402

from tests.tiny import tiny_tokenizer_dir  # noqa: E402


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory):
    """A small real tokenizer (word-level, trained here) with a ChatML chat template."""
    return tiny_tokenizer_dir(tmp_path_factory.mktemp("tokenizer"))
