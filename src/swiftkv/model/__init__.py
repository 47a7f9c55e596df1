"""The SwiftKV core: config geometry (`config`), the HF models (`modeling`), the model families
(`families`) and the surgery that turns a model into a SwiftKV model and back (`surgery`).
Conversion, distillation, evaluation and serving all build on these."""

from .config import LlamaSwiftKVConfig, Qwen2SwiftKVConfig, SwiftKVConfigError
from .modeling import LlamaSwiftKVForCausalLM, PairHidden, Qwen2SwiftKVForCausalLM, swiftkv_parameters

__all__ = [
    "LlamaSwiftKVConfig",
    "LlamaSwiftKVForCausalLM",
    "PairHidden",
    "Qwen2SwiftKVConfig",
    "Qwen2SwiftKVForCausalLM",
    "SwiftKVConfigError",
    "swiftkv_parameters",
]
