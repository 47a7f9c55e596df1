"""swiftkv: SwiftKV (arXiv 2410.03960) for Llama/Qwen2 models.

Importing the package registers the SwiftKV configs and models with transformers' Auto classes, so
`AutoModelForCausalLM.from_pretrained(folder)` opens any SwiftKV checkpoint (ours or Snowflake's).
"""

from transformers import AutoConfig, AutoModelForCausalLM

from .configuration import LlamaSwiftKVConfig, Qwen2SwiftKVConfig, SwiftKVConfigError
from .modeling import LlamaSwiftKVForCausalLM, Qwen2SwiftKVForCausalLM

__version__ = "0.1.0"

for _config, _model in ((LlamaSwiftKVConfig, LlamaSwiftKVForCausalLM), (Qwen2SwiftKVConfig, Qwen2SwiftKVForCausalLM)):
    AutoConfig.register(_config.model_type, _config, exist_ok=True)
    AutoModelForCausalLM.register(_config, _model, exist_ok=True)

__all__ = [
    "LlamaSwiftKVConfig",
    "LlamaSwiftKVForCausalLM",
    "Qwen2SwiftKVConfig",
    "Qwen2SwiftKVForCausalLM",
    "SwiftKVConfigError",
]
