"""The model families SwiftKV supports: one registry, read by conversion, loading, the package's
Auto registration and the vLLM plugin. A new family is one entry here (plus its vLLM decoder layer
in `swiftkv.vllm.model`)."""

from __future__ import annotations

from dataclasses import dataclass

from .config import LlamaSwiftKVConfig, Qwen2SwiftKVConfig
from .modeling import LlamaSwiftKVForCausalLM, Qwen2SwiftKVForCausalLM


@dataclass(frozen=True)
class Family:
    base_type: str  # transformers model_type of the original model, e.g. "llama"
    config_class: type  # its SwiftKV config (model_type "<base>_swiftkv")
    model_class: type  # its SwiftKV causal LM

    @property
    def swiftkv_type(self) -> str:
        return self.config_class.model_type

    @property
    def architecture(self) -> str:
        return self.model_class.__name__


FAMILIES = {f.base_type: f for f in (Family("llama", LlamaSwiftKVConfig, LlamaSwiftKVForCausalLM),
                                      Family("qwen2", Qwen2SwiftKVConfig, Qwen2SwiftKVForCausalLM))}
BASE_MODEL_TYPES = tuple(FAMILIES)
SUPPORTED_MODEL_TYPES = (*BASE_MODEL_TYPES, *(f.swiftkv_type for f in FAMILIES.values()))
ARCHITECTURES = tuple(f.architecture for f in FAMILIES.values())


def family_of(model_type: str) -> Family:
    """The family of a plain or SwiftKV model_type."""
    family = FAMILIES.get(model_type.removesuffix("_swiftkv"))
    if family is None:
        raise ValueError(f"model_type {model_type!r} is not supported; expected one of {list(SUPPORTED_MODEL_TYPES)} "
                         "(Llama- or Qwen2-family causal LMs)")
    return family
