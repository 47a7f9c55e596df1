"""What a model family is (`Family`: its classes, traits and vLLM routes) and the rules most families share:
Llama's biases, the sliding-window refusal, the refusals of an MoE source."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..counts import GROUPED_QUERY_ATTENTION, AttentionCounts
from ..inits import grouped_init_tensors
from ..mla import LATENT_ATTENTION, SwiftKVLatentAttentionMixin, SwiftKVLatentModelMixin
from ..modeling import swiftkv_causal_lm

VLLM_MODELS = "vllm.model_executor.models"


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


def quantized_experts_refusal(config) -> str | None:
    """Why a quantized MoE source cannot become SwiftKV (None: it is not quantized). Conversion runs the
    teacher in full precision and writes every expert back; a quantized checkpoint (FP8, AWQ, GPTQ, ...)
    would have to be dequantized and requantized, which nothing here does."""
    quantization = getattr(config, "quantization_config", None)
    if not quantization:
        return None
    method = quantization.get("quant_method") if isinstance(quantization, dict) else None
    method = method or getattr(quantization, "quant_method", None) or "unknown"
    return (
        f"its weights are quantized (quantization_config.quant_method={str(method)!r}), experts included "
        "(mlp.experts.*); SwiftKV converts unquantized checkpoints only: convert the bf16/fp32 release of "
        "this model"
    )


def moe_source_refusal(config) -> str | None:
    """Why an MoE source cannot become SwiftKV: a sliding window (as for the dense families) or
    quantized experts."""
    return sliding_window_refusal(config) or quantized_experts_refusal(config)


def as_read_from_gguf(config) -> None:
    """A GGUF file's config as transformers reads it needs nothing more."""


@dataclass(frozen=True)
class Family:
    """One family's traits. Its transformers classes are transformers' own `<display>...` classes of
    `base_type` with the SwiftKV parts mixed in (built here, as `model_class`)."""

    base_type: str  # transformers model_type of the family's plain model, e.g. "llama"
    config_class: type  # its SwiftKV config (model_type "<base>_swiftkv")
    display: str  # the family's name in messages and docs, and its transformers class prefix
    vllm_layer: str | None  # "module:Class" of vLLM's decoder layer for the early layers; None: not served
    # "module:Class" of vLLM's MoE block that the later layers' sparse layers build (None: vLLM's LlamaMLP, as
    # the dense families and an MoE family's dense layers), held as the layer's `moe_attribute`: the name its
    # checkpoints and vLLM's own decoder layer give it (Mixtral: block_sparse_moe).
    vllm_moe: str | None = None
    moe_attribute: str = "mlp"
    biases: Callable[[object], dict[str, bool]] = config_biases  # which vLLM projections carry a bias
    qk_norm: bool = False  # q/k normalised per head before RoPE (Qwen3): the student carries its own norms
    other_sources: tuple[str, ...] = ()  # further plain model_types converted into this family
    source_refusal: Callable[[object], str | None] = sliding_window_refusal
    checkpoint_layout: str | None = None  # MoE: the base type whose expert layout it saves
    latent_attention: bool = False  # multi-head latent attention (DeepSeek): the SwiftKV attention of `mla`
    vllm_blocker: str | None = None  # why vLLM cannot serve the family, whatever the plugin builds
    # What a config read from a GGUF file needs before it is saved (llama.cpp records less than transformers
    # fills in); by default nothing.
    gguf_config: Callable[[object], None] = as_read_from_gguf
    # The reference inits of its SwiftKV attention tensors from the teacher's (config, weights, average_group)
    init_tensors: Callable[..., dict] = grouped_init_tensors
    model_class: type = field(init=False)  # its SwiftKV causal LM

    def __post_init__(self):
        mixins = (
            (SwiftKVLatentAttentionMixin, SwiftKVLatentModelMixin) if self.latent_attention else (None, None)
        )
        model = swiftkv_causal_lm(self.display, self.base_type, self.config_class, self.qk_norm, *mixins)
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

    @property
    def lstsq_reference(self) -> str:
        """The init that convert's lstsq replaces tensors of, and is compared with: the copy of each owner's K/V
        projections, or for latent attention the group mean (its lstsq fits the latent projection from there)."""
        return "mean" if self.latent_attention else "copy"

    @property
    def attention(self) -> AttentionCounts:
        """What its kind of attention computes and keeps per token (the FLOP model's and the plan's counts)."""
        return LATENT_ATTENTION if self.latent_attention else GROUPED_QUERY_ATTENTION

    @property
    def experts(self) -> bool:
        """Whether its layers hold Mixture-of-Experts blocks (routers and experts, kept frozen)."""
        return self.checkpoint_layout is not None

    def spelled_alike(self, name: str) -> bool:
        """Whether tensor `name` is spelled alike in the model and its checkpoints. An MoE family's MLP is
        stored in the source's own layout (per-expert tensors, under `moe_attribute`), which transformers fuses
        and renames on load (`checkpoint_layout`): its names differ. Everything else, attention included,
        matches by name."""
        if not self.experts:
            return True
        return ".self_attn." in name or all(f".{part}." not in name for part in {"mlp", self.moe_attribute})

    def mlp_training_refusal(self, config) -> str | None:
        """Why the later layers' MLP cannot train (None: it can): an MoE block's routers and experts stay
        frozen."""
        if not self.experts:
            return None
        return (
            f"this {config.model_type} model's later layers' MLP are Mixture-of-Experts blocks, whose routers "
            "and experts stay frozen"
        )
