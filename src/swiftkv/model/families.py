"""The model families SwiftKV supports: one registry, read by conversion, loading, the package's
exports and Auto registration, the auto_map shim written into every folder, the error messages and
the vLLM plugin. A new Llama-like family is one entry here plus its config class (`model.config`):
the entry's traits build its transformers classes (`modeling.swiftkv_causal_lm`) and tell the one vLLM
model class (`swiftkv.vllm.model`) how to serve it.

A family may accept several source model_types: Mistral checkpoints are Llama-shaped (same weight
names and math, their own `head_dim`), so they convert into the Llama family (`llama_swiftkv`) as
long as they use no sliding window (`source_refusal`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .config import LlamaSwiftKVConfig, Qwen2SwiftKVConfig, Qwen3SwiftKVConfig
from .modeling import swiftkv_causal_lm


def sliding_window_refusal(config) -> str | None:
    """Why a source with a sliding window cannot become SwiftKV (None: it can). The SwiftKV layers
    attend over one K/V per group computed for every token; a window that cuts the context would
    need its own masks in the HF model, the vLLM holders and the calibration, which nothing here
    implements, so such a model is refused rather than served with full attention (different math)."""
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None) or []
    if window is None or (
        getattr(config, "use_sliding_window", True) is False and "sliding_attention" not in layer_types
    ):
        return None
    context = getattr(config, "max_position_embeddings", None)
    if context is not None and window >= context:
        return None  # a window at least as long as the context never cuts anything
    return (
        f"it uses sliding-window attention (sliding_window={window}, max_position_embeddings={context}); "
        "SwiftKV here supports full attention only. A checkpoint whose config sets sliding_window to null "
        "(e.g. Mistral-7B-v0.2 and later) converts"
    )


def config_biases(config) -> dict[str, bool]:
    """Llama's rule: `attention_bias` on q/k/v and o_proj, `mlp_bias` on the MLP."""
    attention = bool(getattr(config, "attention_bias", False))
    return {"qkv_bias": attention, "o_bias": attention, "mlp_bias": bool(getattr(config, "mlp_bias", False))}


def qkv_biases(config) -> dict[str, bool]:
    """Qwen2's rule: q/k/v always carry a bias, o_proj and the MLP never."""
    return {"qkv_bias": True, "o_bias": False, "mlp_bias": False}


QWEN3_ATTENTION_BIAS_HELP = (
    "this qwen3_swiftkv config sets attention_bias=true: transformers' Qwen3 then adds a bias to q/k/v and "
    "o_proj, but vLLM's own Qwen3 layer (which serves the early layers) has no o_proj bias, so vLLM would compute "
    "another model. Published Qwen3 checkpoints use attention_bias=false; serve this one with transformers "
    "(swiftkv generate/eval) instead"
)


def no_biases(config) -> dict[str, bool]:
    """Qwen3's rule on vLLM: no biases; a config with attention_bias is refused (QWEN3_ATTENTION_BIAS_HELP)."""
    if getattr(config, "attention_bias", False):
        raise ValueError(QWEN3_ATTENTION_BIAS_HELP)
    return {"qkv_bias": False, "o_bias": False, "mlp_bias": False}


@dataclass(frozen=True)
class Family:
    """One family's traits. Its transformers classes are transformers' own `<display>...` classes of
    `base_type` with the SwiftKV parts mixed in (built here, as `model_class`)."""

    base_type: str  # transformers model_type of the family's plain model, e.g. "llama"
    config_class: type  # its SwiftKV config (model_type "<base>_swiftkv")
    display: str  # the family's name in messages and docs, and its transformers class prefix
    vllm_layer: str  # "module:Class" of vLLM's own decoder layer, which serves the early layers
    biases: Callable[[object], dict[str, bool]] = config_biases  # which vLLM projections carry a bias
    qk_norm: bool = False  # q/k normalised per head before RoPE (Qwen3): the student carries its own norms
    other_sources: tuple[str, ...] = ()  # further plain model_types converted into this family
    source_refusal: Callable[[object], str | None] = sliding_window_refusal
    model_class: type = field(init=False)  # its SwiftKV causal LM

    def __post_init__(self):
        model = swiftkv_causal_lm(self.display, self.base_type, self.config_class, self.qk_norm)
        object.__setattr__(self, "model_class", model)

    @property
    def swiftkv_type(self) -> str:
        return self.config_class.model_type

    @property
    def architecture(self) -> str:
        return self.model_class.__name__

    @property
    def source_types(self) -> tuple[str, ...]:
        return (self.base_type, *self.other_sources)


VLLM_MODELS = "vllm.model_executor.models"
FAMILIES = {
    f.base_type: f
    for f in (
        Family(
            "llama",
            LlamaSwiftKVConfig,
            "Llama",
            f"{VLLM_MODELS}.llama:LlamaDecoderLayer",
            other_sources=("mistral",),
        ),
        Family(
            "qwen2", Qwen2SwiftKVConfig, "Qwen2", f"{VLLM_MODELS}.qwen2:Qwen2DecoderLayer", biases=qkv_biases
        ),
        Family(
            "qwen3",
            Qwen3SwiftKVConfig,
            "Qwen3",
            f"{VLLM_MODELS}.qwen3:Qwen3DecoderLayer",
            biases=no_biases,
            qk_norm=True,
        ),
    )
}
SOURCE_FAMILIES = {source: f for f in FAMILIES.values() for source in f.source_types}
BASE_MODEL_TYPES = tuple(SOURCE_FAMILIES)  # plain model_types that convert (llama, mistral, qwen2, qwen3)
SUPPORTED_MODEL_TYPES = (*BASE_MODEL_TYPES, *(f.swiftkv_type for f in FAMILIES.values()))
ARCHITECTURES = tuple(f.architecture for f in FAMILIES.values())
SWIFTKV_CLASSES = tuple(cls for f in FAMILIES.values() for cls in (f.config_class, f.model_class))
FAMILY_NAMES = ", ".join(
    sorted(
        {name for f in FAMILIES.values() for name in (f.display, *(s.capitalize() for s in f.other_sources))}
    )
)


def unsupported(model_type) -> str:
    return (
        f"model_type {model_type!r} is not supported; expected one of {list(SUPPORTED_MODEL_TYPES)} "
        f"({FAMILY_NAMES} causal LMs)"
    )


def family_of(model_type: str) -> Family:
    """The family of a plain or SwiftKV model_type (a Mistral source is in the Llama family)."""
    if model_type.endswith("_swiftkv"):
        family = FAMILIES.get(model_type.removesuffix("_swiftkv"))
    else:
        family = SOURCE_FAMILIES.get(model_type)
    if family is None:
        raise ValueError(unsupported(model_type))
    return family
