"""The SwiftKV keys every family's config carries (`SwiftKVConfigMixin`; each family's config class is in its
file under `families/`), in the published Snowflake format.

A SwiftKV config is the base model's config plus three keys:
  swiftkv               -- run the student path (True) or the original teacher path (False)
  num_key_value_layers  -- N: layers >= N take their K/V from norm_swiftkv(h_N)
  key_value_group_size  -- G: AcrossKV, consecutive later layers share one K/V in groups of G
Everything derived from them (which layers are later, who owns a group's K/V, where a layer's
cache lives) is computed here once, so the HF model, conversion, distillation and the vLLM model
agree on it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..files import write_atomic


class SwiftKVConfigError(ValueError):
    """A SwiftKV setting that cannot describe a valid model."""


def is_swiftkv(config) -> bool:
    """Whether a model, its config, or config.json as a dict is SwiftKV: it names N. The one test used
    wherever a plain model and a SwiftKV model are told apart."""
    config = getattr(config, "config", config)  # a model: its config
    value = (
        config.get("num_key_value_layers")
        if isinstance(config, dict)
        else getattr(config, "num_key_value_layers", None)
    )
    return value is not None


def head_dim_of(config) -> int:
    """Per-head width: the config's own `head_dim` where it has one, else hidden / heads."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def is_sparse_layer(config, layer: int) -> bool:
    """Whether decoder layer `layer` holds an MoE block: the rule of transformers' and vLLM's Qwen-MoE layers
    (not in `mlp_only_layers`, experts configured, every `decoder_sparse_step`-th layer); every layer of
    Mixtral (`num_local_experts`, none of those keys); DeepSeek's from `first_k_dense_replace` on (its
    `n_routed_experts` read as `num_experts` through the config's attribute map). Dense configs have no
    experts: no layer is sparse."""
    return (
        routed_experts(config) > 0
        and layer not in (getattr(config, "mlp_only_layers", None) or [])
        and (layer + 1) % (getattr(config, "decoder_sparse_step", None) or 1) == 0
        and layer >= (getattr(config, "first_k_dense_replace", None) or 0)
    )


def routed_experts(config) -> int:
    """How many experts an MoE block routes among (Qwen-MoE's `num_experts`, Mixtral's `num_local_experts`,
    DeepSeek's `n_routed_experts` through its config's attribute map); 0 for a dense config."""
    return getattr(config, "num_experts", None) or getattr(config, "num_local_experts", None) or 0


def num_key_value_layers_for(num_layers: int, swiftkv_fraction: float) -> int:
    """N for a fraction F of the layers becoming SwiftKV (later) layers: N = L - round(F * L),
    kept within [1, L - 1] so that at least one early and one later layer remain."""
    if not 0.0 < swiftkv_fraction < 1.0:
        raise SwiftKVConfigError(f"SwiftKV fraction {swiftkv_fraction} is out of range; expected 0 < F < 1")
    return min(max(num_layers - round(swiftkv_fraction * num_layers), 1), num_layers - 1)


def with_legacy_rope_keys(config: dict) -> dict:
    """`config` plus the top-level `rope_theta` (and `rope_scaling` for a non-default RoPE) that
    transformers 4.x reads: ArcticTraining's SwiftKV model code and older vLLM versions run on it, and
    without these keys they silently use theta 10000. transformers 5 writes only `rope_parameters`
    and, reading, takes it over the legacy keys; both are written from it, so they cannot disagree."""
    rope = config.get("rope_parameters") or {}
    if "rope_theta" in rope:
        config["rope_theta"] = rope["rope_theta"]
    if rope.get("rope_type", "default") != "default":
        config["rope_scaling"] = {key: value for key, value in rope.items() if key != "rope_theta"}
    return config


def add_legacy_rope_keys(folder) -> None:
    """Rewrite `folder/config.json` (saved by transformers 5) with the legacy RoPE keys."""

    path = Path(folder) / "config.json"
    write_atomic(
        path, json.dumps(with_legacy_rope_keys(json.loads(path.read_text())), indent=2, sort_keys=True) + "\n"
    )


# A dataclass of its own, so each family's config (which transformers makes a dataclass) inherits these fields
# after its base config's: declared once for every family.
@dataclass(repr=False, eq=False, init=False, kw_only=True)
class SwiftKVConfigMixin:
    """The SwiftKV keys and their derived geometry, mixed into each family's base config. `swiftkv_trimmed`
    marks checkpoints without the later layers' original q/k/v; `swiftkv_student_trained` names the later-layer
    modules (e.g. "mlp") distilled for the student. Either kind can only run the student path."""

    swiftkv: bool = False  # run the student path (True) or the teacher path (False)
    num_key_value_layers: int | None = None  # N; None: not a SwiftKV model (`is_swiftkv`)
    key_value_group_size: int = 1  # G
    swiftkv_trimmed: bool = False
    swiftkv_student_trained: list[str] | None = None

    def to_dict(self) -> dict:
        """Saved SwiftKV configs carry the legacy RoPE keys too (see `with_legacy_rope_keys`)."""
        return with_legacy_rope_keys(super().to_dict())

    def __post_init__(self, **kwargs):
        super().__post_init__(**kwargs)
        if self.num_key_value_layers is not None:
            self.check_swiftkv_geometry()

    # Not named validate_*: huggingface_hub strict dataclasses run those on every instantiation,
    # including the default one transformers builds to compare generation parameters.
    def check_swiftkv_geometry(self) -> None:
        n, g, layers = self.num_key_value_layers, self.key_value_group_size, self.num_hidden_layers
        if n is None:
            raise SwiftKVConfigError(
                f"{type(self).__name__}: num_key_value_layers is not set; expected an integer in [1, {layers - 1}]"
            )
        if not 1 <= n < layers:
            raise SwiftKVConfigError(
                f"num_key_value_layers={n} is out of range: expected 1 <= N <= {layers - 1} "
                f"(the model has {layers} layers and SwiftKV needs at least one early and one later layer)"
            )
        if g < 1 or (layers - n) % g != 0:
            divisors = [d for d in range(1, layers - n + 1) if (layers - n) % d == 0]
            raise SwiftKVConfigError(
                f"key_value_group_size={g} does not divide the {layers - n} later layers "
                f"(num_hidden_layers={layers} - num_key_value_layers={n}); expected one of {divisors}"
            )

    @property
    def teacher_missing(self) -> str | None:
        """Why this folder cannot run its teacher path (None: it can). A trimmed folder lost the later
        layers' original q/k/v; a folder whose later layers were trained for the student
        (`swiftkv_student_trained`, e.g. ["mlp"]) holds the student's weights under the teacher's names."""
        if self.swiftkv_trimmed:
            return (
                f"it was converted with --trim: the original q/k/v projections of layers >= "
                f"{self.num_key_value_layers} were dropped"
            )
        if self.swiftkv_student_trained:
            return (
                f"its later layers' {', '.join(self.swiftkv_student_trained)} were distilled for the student "
                f"(layers >= {self.num_key_value_layers} no longer hold the teacher's weights)"
            )
        return None

    @property
    def later_layers(self) -> range:
        """Indices of the layers whose K/V come from norm_swiftkv(h_N)."""
        return range(self.num_key_value_layers, self.num_hidden_layers)

    @property
    def num_kv_groups(self) -> int:
        return (self.num_hidden_layers - self.num_key_value_layers) // self.key_value_group_size

    def group_of(self, layer: int) -> int:
        """AcrossKV group (0-based) of a later layer."""
        return (layer - self.num_key_value_layers) // self.key_value_group_size

    def kv_owner(self, layer: int) -> int:
        """The lowest-index layer of `layer`'s group: it owns k_proj_swiftkv / v_proj_swiftkv."""
        return self.num_key_value_layers + self.group_of(layer) * self.key_value_group_size

    @property
    def kv_owners(self) -> list[int]:
        """The owner of each AcrossKV group, in group order."""
        return [self.kv_owner(layer) for layer in self.later_layers if self.is_kv_owner(layer)]

    def is_kv_owner(self, layer: int) -> bool:
        return layer >= self.num_key_value_layers and self.kv_owner(layer) == layer

    def cache_index(self, layer: int) -> int:
        """Slot of `layer`'s K/V in a student KV cache: early layers keep their own slot, each later
        group gets one slot after them, so the cache holds N + (L - N) / G entries."""
        if layer < self.num_key_value_layers:
            return layer
        return self.num_key_value_layers + self.group_of(layer)

    @property
    def num_cache_slots(self) -> int:
        return self.num_key_value_layers + self.num_kv_groups
