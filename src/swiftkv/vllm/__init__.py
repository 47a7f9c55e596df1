"""vLLM plugin for SwiftKV checkpoints.

`register()` is the `vllm.general_plugins` entry point (pyproject.toml). vLLM calls it in every
process it starts (front end, engine core, workers), so `vllm.LLM(model=FOLDER)` and
`vllm serve FOLDER` open a SwiftKV folder with no import by the user. It must stay cheap and
idempotent: vLLM may call it several times per process.
"""

from __future__ import annotations

# Importing this package imported `swiftkv` first, which registered every family's <base>_swiftkv
# config with transformers' AutoConfig (vLLM reads the configs through it).
from swiftkv.model.families import ARCHITECTURES

from .guards import install_prompt_logprobs_guard
from .versions import check_vllm_version

LOGGER_NAME = "vllm.plugins.swiftkv"  # under "vllm" so vLLM's log handler (with the process name) prints it
_registered_in_process = False


def register() -> None:
    """Make vLLM know the SwiftKV configs (via transformers' AutoConfig), the model classes (lazily,
    by module path), the config hook that switches on kv_sharing_fast_prefill, and the front-end guard
    that refuses prompt-logprobs requests such an engine cannot serve (`guards`)."""
    global _registered_in_process
    from vllm import ModelRegistry, __version__
    from vllm.logger import init_logger
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP

    check_vllm_version(__version__)  # before any import that an unsupported vLLM may lack
    from .hooks import SwiftKVConfigHook  # imports vLLM

    supported = set(ModelRegistry.get_supported_archs())
    for arch in ARCHITECTURES:
        if arch not in supported:
            ModelRegistry.register_model(arch, "swiftkv.vllm.model:SwiftKVForCausalLM")
        MODELS_CONFIG_MAP[arch] = SwiftKVConfigHook
    install_prompt_logprobs_guard()
    if not _registered_in_process:
        _registered_in_process = True
        init_logger(LOGGER_NAME).info("swiftkv plugin registered %s", ", ".join(ARCHITECTURES))
