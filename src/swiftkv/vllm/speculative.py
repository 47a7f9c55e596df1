"""Speculative decoding beside SwiftKV: which of vLLM's methods can run with SwiftKV's prefill
skip, checked before the engine starts (importable without vLLM).

`swiftkv serve` checks the user's `--speculative-config` (and `--spec-method` / `--spec-model`) with
`check_speculative_options`; the plugin's config hook checks the engine's resolved method with
`check_speculative_method`, so `vllm.LLM(model=SWIFTKV_FOLDER, speculative_config=...)` gets the same
answer. Both raise one ValueError naming the method, why it cannot run, and what works instead.

Why only proposers that need no hidden states of the target work: with `--kv-sharing-fast-prefill`
(SwiftKV's prefill skip) the later layers run only on the rows that need logits. A verify step asks
for logits at every draft and bonus position, so every row a proposer's drafts are checked on does
reach the later layers: greedy output is unchanged (tested). What SwiftKV never computes is the
target's hidden states of prompt tokens, and proposers that draft from those cannot run.
"""

from __future__ import annotations

import importlib.util
import json

# The methods of vLLM's SpeculativeMethod (config/speculative.py) in 0.32 and 0.33: 0.33 added step5_mtp and
# dropped medusa and mlp_speculator. A test checks that the installed vLLM's are among them.
MTP_METHODS = (
    "deepseek_mtp",
    "dots3_note_mtp",
    "mimo_mtp",
    "mimo_v2_mtp",
    "glm4_moe_mtp",
    "glm4_moe_lite_mtp",
    "glm_ocr_mtp",
    "ernie_mtp",
    "nemotron_h_mtp",
    "exaone_moe_mtp",
    "exaone4_5_mtp",
    "qwen3_next_mtp",
    "qwen4_exp_mtp",
    "qwen3_5_mtp",
    "longcat_flash_mtp",
    "bailing_hybrid_v3_mtp",
    "minimax_m3_mtp",
    "bailing_hybrid_mtp",
    "mtp",
    "kimi_k3_mtp",
    "pangu_ultra_moe_mtp",
    "step3p5_mtp",
    "step5_mtp",
    "hy_v3_mtp",
    "hy_v4_mtp",
    "gemma4_mtp",
    "inkling_mtp",
    "glm5_next_mtp",
)
HIDDEN_STATE_METHODS = ("eagle", "eagle3", "extract_hidden_states", "dflash", "dspark", *MTP_METHODS)
VLLM_METHODS = (
    "ngram",
    "medusa",
    "mlp_speculator",
    "draft_model",
    "suffix",
    "custom_class",
    "ngram_gpu",
    *HIDDEN_STATE_METHODS,
)

NGRAM_EXAMPLE = '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}'

SUFFIX_UNAVAILABLE = (
    "suffix decoding needs the arctic-inference package (its suffix tree is a C++ extension), which is not "
    "installed beside vLLM here"
)

REASONS = {
    "hidden states": (
        "it drafts from the target model's hidden states at every token, and with SwiftKV's prefill skip "
        "(--kv-sharing-fast-prefill) prompt tokens never reach the later layers, so those hidden states are never "
        "computed (vLLM itself refuses EAGLE-style methods with fast prefill)"
    ),
    "medusa": (
        "its heads draft from the target's last hidden state and must be trained for that exact model; no heads "
        "exist for a SwiftKV checkpoint and the combination is not tested"
    ),
    "draft_model": (
        "vLLM registers the draft model's attention layers after SwiftKV's, so its search for the trailing "
        "KV-sharing layers stops at once: every prompt token would run every layer, silently losing SwiftKV's "
        "prefill saving (output correct, no speed-up)"
    ),
    "ngram_gpu": "it is the GPU kernel version of ngram and is not tested with SwiftKV",
    "custom_class": (
        "a user-supplied proposer may read the target's hidden states or prompt logits, which SwiftKV's prefill "
        "skip does not compute; it is not tested with SwiftKV"
    ),
}


def suffix_available() -> bool:
    """vLLM's suffix proposer imports `arctic_inference.suffix_decoding` (a compiled extension)."""
    try:
        return importlib.util.find_spec("arctic_inference.suffix_decoding") is not None
    except ModuleNotFoundError:
        return False


def working_methods(with_suffix: bool | None = None) -> tuple[str, ...]:
    with_suffix = suffix_available() if with_suffix is None else with_suffix
    return ("ngram", "suffix") if with_suffix else ("ngram",)


def what_works(with_suffix: bool | None = None) -> str:
    methods = working_methods(with_suffix)
    names = " or ".join(f"'{m}'" for m in methods)
    return (
        f"Speculative methods that work with SwiftKV: {names} (they draft from the token history only), "
        f"e.g. --speculative-config '{NGRAM_EXAMPLE}'"
    )


def reason_for(method: str) -> str:
    if method in HIDDEN_STATE_METHODS:
        return REASONS["hidden states"]
    if method in ("medusa", "mlp_speculator"):
        return REASONS["medusa"]
    return REASONS[method]


def check_speculative_method(method: str | None, with_suffix: bool | None = None) -> None:
    """Refuse a resolved speculative method that cannot run with SwiftKV (None: no speculation)."""
    if method is None or method in working_methods(with_suffix):
        return
    works = what_works(with_suffix)
    if method == "suffix":
        raise ValueError(
            f"speculative method 'suffix' cannot run with SwiftKV here: {SUFFIX_UNAVAILABLE}. {works}"
        )
    if method not in VLLM_METHODS:
        raise ValueError(f"speculative method {method!r} is not one vLLM knows. {works}")
    raise ValueError(f"speculative method {method!r} cannot run with SwiftKV: {reason_for(method)}. {works}")


def is_custom_proposer_path(model: str) -> bool:
    """vLLM's rule (SpeculativeConfig._is_custom_proposer_path): a dotted import path names a class."""
    if model.startswith(("http://", "https://", "file://")) or "/" in model:
        return False
    parts = model.split(".")
    return len(parts) >= 2 and all(part.isidentifier() for part in parts)


def resolve_method(config: dict) -> str:
    """The method vLLM will run for a speculative config dict, as far as it can be known before a
    draft model is opened: an explicit method, else inferred from `model` as vLLM does. A `model` that
    is a checkpoint becomes 'draft_model' (vLLM may then see an EAGLE, Medusa or MLP head in it; every
    one of those is refused too)."""
    config = {str(k).replace("-", "_"): v for k, v in config.items()}
    method, model = config.get("method"), config.get("model")
    if method is not None:
        method = str(method)
        return "ngram" if method == "[ngram]" else method
    if model is None:
        raise ValueError(
            f"the speculative config {json.dumps(config)} names neither a method nor a model. {what_works()}"
        )
    model = str(model)
    if model in ("ngram", "[ngram]"):
        return "ngram"
    if is_custom_proposer_path(model):
        return "custom_class"
    return "draft_model"


def check_speculative_config(config: dict | None, with_suffix: bool | None = None) -> None:
    if config:
        check_speculative_method(resolve_method(config), with_suffix)


def _option_values(vllm_args: list[str], *names: str) -> list[tuple[str, str]]:
    """(option, value) for every `--opt VALUE` / `--opt=VALUE` of the given names, in order."""
    found = []
    for i, arg in enumerate(vllm_args):
        for name in names:
            if arg.startswith(name + "="):
                found.append((name, arg.split("=", 1)[1]))
            elif arg == name and i + 1 < len(vllm_args):
                found.append((name, vllm_args[i + 1]))
    return found


def speculative_options(vllm_args: list[str]) -> dict | None:
    """The speculative config a `vllm serve` command line asks for: `--speculative-config` / `-sc` (JSON),
    its dotted keys (`--speculative-config.method ngram`), and `--spec-method` / `--spec-model`."""
    config: dict = {}
    for option, text in _option_values(vllm_args, "--speculative-config", "-sc"):
        try:
            value = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(
                f"{option} {text!r} is not JSON ({error.msg}); expected e.g. {option} '{NGRAM_EXAMPLE}'"
            ) from None
        if not isinstance(value, dict):
            raise ValueError(
                f"{option} {text!r} is not a JSON object; expected e.g. {option} '{NGRAM_EXAMPLE}'"
            )
        config.update(value)
    for i, arg in enumerate(vllm_args):
        for prefix in ("--speculative-config.", "-sc."):
            if arg.startswith(prefix):
                key, separator, value = arg[len(prefix) :].partition("=")
                if not separator and i + 1 < len(vllm_args):
                    value = vllm_args[i + 1]
                config[key] = value
    for option, key in (("--spec-method", "method"), ("--spec-model", "model")):
        for _, value in _option_values(vllm_args, option):
            config[key] = value
    return config or None


def check_speculative_options(vllm_args: list[str], with_suffix: bool | None = None) -> str | None:
    """`swiftkv serve`'s check of the command line; returns the method that will run (None: none)."""
    config = speculative_options(vllm_args)
    check_speculative_config(config, with_suffix)
    return resolve_method(config) if config else None
