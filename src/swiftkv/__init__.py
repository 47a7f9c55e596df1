"""swiftkv: SwiftKV (arXiv 2410.03960) for Llama, Mistral, Qwen2 and Qwen3 models, the
Mixture-of-Experts Qwen3-MoE, Qwen2-MoE and Mixtral, and DeepSeek-V2/V3 (multi-head latent attention,
transformers only).

Importing the package registers the SwiftKV configs and models with transformers' Auto classes, so
`AutoModelForCausalLM.from_pretrained(folder)` opens any SwiftKV checkpoint (ours or Snowflake's).
Each family's `<Family>SwiftKVConfig` / `<Family>SwiftKVForCausalLM` is exported from the registry
(`swiftkv.model.families`), e.g. `swiftkv.Qwen3SwiftKVForCausalLM`.
"""

from transformers import AutoConfig, AutoModelForCausalLM

from .model import SwiftKVConfigError as SwiftKVConfigError
from .model.families import FAMILIES, SWIFTKV_CLASSES, register_checkpoint_layout

__version__ = "0.1.0"

for _family in FAMILIES.values():
    AutoConfig.register(_family.swiftkv_type, _family.config_class, exist_ok=True)
    AutoModelForCausalLM.register(_family.config_class, _family.model_class, exist_ok=True)
    if _family.checkpoint_layout is not None:  # MoE: experts read and written as the source's checkpoints
        register_checkpoint_layout(_family.swiftkv_type, _family.checkpoint_layout)

globals().update({cls.__name__: cls for cls in SWIFTKV_CLASSES})

__all__ = sorted([cls.__name__ for cls in SWIFTKV_CLASSES] + ["SwiftKVConfigError"])
