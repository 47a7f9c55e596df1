"""swiftkv: SwiftKV (arXiv 2410.03960) for Llama/Qwen2 models.

Importing the package registers the SwiftKV configs and models with transformers' Auto classes, so
`AutoModelForCausalLM.from_pretrained(folder)` opens any SwiftKV checkpoint (ours or Snowflake's).
"""

from transformers import AutoConfig, AutoModelForCausalLM

from .model import (
    LlamaSwiftKVConfig,
    LlamaSwiftKVForCausalLM,
    Qwen2SwiftKVConfig,
    Qwen2SwiftKVForCausalLM,
    SwiftKVConfigError,
)
from .model.families import FAMILIES

__version__ = "0.1.0"

for _family in FAMILIES.values():
    AutoConfig.register(_family.swiftkv_type, _family.config_class, exist_ok=True)
    AutoModelForCausalLM.register(_family.config_class, _family.model_class, exist_ok=True)

__all__ = [
    "LlamaSwiftKVConfig",
    "LlamaSwiftKVForCausalLM",
    "Qwen2SwiftKVConfig",
    "Qwen2SwiftKVForCausalLM",
    "SwiftKVConfigError",
]
