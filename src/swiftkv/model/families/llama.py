"""Llama, and Mistral sources (Llama-shaped: the same weight names and math, their own `head_dim`) as long as
they use no sliding window. The published Snowflake format `llama_swiftkv`."""

from __future__ import annotations

from huggingface_hub.dataclasses import strict
from transformers import LlamaConfig

from ..config import SwiftKVConfigMixin
from .family import VLLM_MODELS, Family


@strict
class LlamaSwiftKVConfig(SwiftKVConfigMixin, LlamaConfig):
    """LlamaConfig + the SwiftKV keys (`SwiftKVConfigMixin`)."""

    model_type = "llama_swiftkv"


def gguf_config(config) -> None:
    """A Mistral GGUF records no sliding window and llama.cpp runs these files with full attention; the window
    transformers' MistralConfig fills in (4096) is its default, not the file's."""
    if config.model_type == "mistral":
        config.sliding_window = None


FAMILY = Family(
    "llama",
    LlamaSwiftKVConfig,
    "Llama",
    f"{VLLM_MODELS}.llama:LlamaDecoderLayer",
    other_sources=("mistral",),
    gguf_config=gguf_config,
)
