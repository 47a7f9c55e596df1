"""Engine-config hook for SwiftKV architectures (vLLM's per-architecture `VerifyAndUpdateConfig`)."""

from __future__ import annotations

from vllm.logger import init_logger
from vllm.model_executor.models.config import VerifyAndUpdateConfig

logger = init_logger("vllm.plugins.swiftkv")


class SwiftKVConfigHook(VerifyAndUpdateConfig):
    """Switch on kv_sharing_fast_prefill: without it vLLM would run every prompt token through the
    later layers, i.e. SwiftKV would give no prefill saving. vLLM runs this hook while it builds the
    engine config, before the model runner sizes its fast-prefill buffers."""

    @staticmethod
    def verify_and_update_config(vllm_config) -> None:
        cache_config = vllm_config.cache_config
        if not cache_config.kv_sharing_fast_prefill:
            logger.info("SwiftKV: switching on kv_sharing_fast_prefill (prompt tokens skip layers >= N)")
            cache_config.kv_sharing_fast_prefill = True
