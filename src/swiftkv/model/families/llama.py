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


FAMILY = Family(
    "llama",
    LlamaSwiftKVConfig,
    "Llama",
    f"{VLLM_MODELS}.llama:LlamaDecoderLayer",
    other_sources=("mistral",),
)
