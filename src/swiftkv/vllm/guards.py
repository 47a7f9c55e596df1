"""Requests a fast-prefill engine cannot serve are refused in the front end, before the engine.

With `--kv-sharing-fast-prefill` (which SwiftKV needs: it is what lets prompt tokens skip the later
layers) the later layers run only on the rows that need logits, so prompt logprobs cannot be
computed. vLLM 0.32 refuses such requests only when `prompt_logprobs` is truthy: `prompt_logprobs=0`,
and chat or completion `echo` with `logprobs` (which become `prompt_logprobs=0`), pass its check
and then hit an assertion in the worker: the engine core dies and the OpenAI server exits, failing
every request in flight. `install_prompt_logprobs_guard` makes the front end's own parameter check
(`InputProcessor._validate_params`, which every endpoint and the offline `LLM` go through) refuse
any `prompt_logprobs` that is set at all; vLLM's server answers that error with a 400.
"""

from __future__ import annotations

REFUSAL = (
    "prompt logprobs are not available on this server: it runs with --kv-sharing-fast-prefill (SwiftKV's "
    "prefill skip), where prompt tokens skip the later layers. Remove prompt_logprobs (0 included) and "
    "echo+logprobs from the request, or serve the model without --kv-sharing-fast-prefill"
)


def asks_for_prompt_logprobs(params) -> bool:
    return getattr(params, "prompt_logprobs", None) is not None


def install_prompt_logprobs_guard() -> None:
    """Idempotent: vLLM may call the plugin's register() several times per process."""
    from vllm.v1.engine.input_processor import InputProcessor

    original = InputProcessor._validate_params
    if getattr(original, "swiftkv_guard", False):
        return

    def _validate_params(self, params, *args, **kwargs):
        if self.vllm_config.cache_config.kv_sharing_fast_prefill and asks_for_prompt_logprobs(params):
            from vllm.exceptions import VLLMValidationError

            raise VLLMValidationError(REFUSAL, parameter="prompt_logprobs")
        return original(self, params, *args, **kwargs)

    _validate_params.swiftkv_guard = True
    InputProcessor._validate_params = _validate_params
