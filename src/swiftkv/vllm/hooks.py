"""Engine-config hook for SwiftKV architectures (vLLM's per-architecture `VerifyAndUpdateConfig`)."""

from __future__ import annotations

import os

from vllm.logger import init_logger
from vllm.model_executor.models.config import VerifyAndUpdateConfig

from ..model.config import head_dim_of
from ..model.families import SUPPORTED_MODEL_TYPES, check_vllm_serves, family_of
from .env import RUNNER_ENV, choose_model_runner
from .kv_dtype import check_kv_cache_dtype
from .speculative import check_speculative_method
from .versions import has_v1_runner

logger = init_logger("vllm.plugins.swiftkv")


CPU_MOE_ALIGNMENT = 32  # vLLM 0.32's CPU fused-MoE kernels (experts/cpu_moe.py): output alignment


def check_cpu_moe_shape(config) -> None:
    """On vLLM's CPU build, refuse an MoE SwiftKV config whose hidden size its fused-MoE kernels cannot
    take, naming the size, before the engine builds anything (vLLM itself finds no MoE kernel while it
    builds the model). The experts' intermediate size needs no check: vLLM zero-pads it to the alignment."""
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES or family_of(model_type).vllm_moe is None:
        return
    if config.hidden_size % CPU_MOE_ALIGNMENT == 0:
        return
    raise ValueError(
        f"this {model_type} config has hidden_size={config.hidden_size}, but vLLM's CPU fused MoE needs "
        f"a hidden size divisible by {CPU_MOE_ALIGNMENT}: serve it on a GPU build of vLLM, or with "
        "transformers (swiftkv generate / swiftkv eval)"
    )


def check_neighbours(vllm_config) -> None:
    """What runs beside SwiftKV: the speculative method (`speculative`) and, on vLLM's CPU engine, the
    KV-cache dtype (`kv_dtype`) and the MoE shape (`check_cpu_moe_shape`). Runs while vLLM builds the
    engine config, before the engine starts, so `vllm.LLM(...)` gets the same one error as `swiftkv serve`."""
    # Resolved at call time: importing `current_platform` while plugins load would fix the platform
    # before vLLM has loaded any platform plugin.
    from vllm import __version__
    from vllm.platforms import current_platform

    if choose_model_runner(os.environ, current_platform.is_cuda(), has_v1_runner(__version__)):
        logger.info(
            "SwiftKV: vLLM's V1 model runner (%s=0), the fast-prefill path the plugin is verified on",
            RUNNER_ENV,
        )
    speculative = vllm_config.speculative_config
    check_speculative_method(speculative.method if speculative is not None else None)
    kv_cache_dtype = vllm_config.cache_config.cache_dtype
    config = vllm_config.model_config.hf_config
    if current_platform.is_cpu():
        check_cpu_moe_shape(config)
        if kv_cache_dtype != "auto":
            check_kv_cache_dtype(kv_cache_dtype, head_dim_of(config))


class SwiftKVConfigHook(VerifyAndUpdateConfig):
    """Switch on kv_sharing_fast_prefill: without it vLLM would run every prompt token through the
    later layers, i.e. SwiftKV would give no prefill saving. vLLM runs this hook while it builds the
    engine config, before the model runner sizes its fast-prefill buffers. Then refuse what cannot run
    beside SwiftKV (`check_neighbours`). A family the plugin cannot serve is refused first, with its
    reason, before the engine builds anything."""

    @staticmethod
    def verify_and_update_config(vllm_config) -> None:
        check_vllm_serves(vllm_config.model_config.hf_config)
        cache_config = vllm_config.cache_config
        if not cache_config.kv_sharing_fast_prefill:
            logger.info("SwiftKV: switching on kv_sharing_fast_prefill (prompt tokens skip layers >= N)")
            cache_config.kv_sharing_fast_prefill = True
        check_neighbours(vllm_config)
