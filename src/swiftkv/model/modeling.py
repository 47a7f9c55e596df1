"""SwiftKV models for transformers: Llama (and Mistral), Qwen2 and Qwen3 with SingleInputKV and AcrossKV.

One definition serves conversion, distillation, evaluation and generation. Only what differs from
transformers' own models is declared here (HF "modular" style):

* later layers (i >= N) carry `q_proj_swiftkv`; group owners also carry `k_proj_swiftkv` /
  `v_proj_swiftkv`; the model carries `norm_swiftkv`;
* Qwen3 (per-head q_norm/k_norm before RoPE) adds `q_norm_swiftkv` per later layer and
  `k_norm_swiftkv` per group owner: Q = q_norm_swiftkv(q_proj_swiftkv(x)), K =
  k_norm_swiftkv(k_proj_swiftkv(s)), both per head and before RoPE; V has no norm;
* `config.swiftkv=False` runs the original (teacher) math, layer by layer as transformers does;
* `config.swiftkv=True` runs the student: K/V of every later layer come from
  s = norm_swiftkv(h_N), one K/V (and one cache slot) per AcrossKV group;
* prefill skip: when only some positions need logits (`logits_to_keep`, which `generate` sets to 1),
  the later layers run on those rows only, after every group's K/V was written for all tokens.

The forward is split into `embed_and_early` and `late` so distillation can run layers < N once and
reuse h_N for both the teacher and the student.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn
from transformers.cache_utils import Cache, DynamicCache
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.llama.modeling_llama import eager_attention_forward, rotate_half
from transformers.utils.generic import merge_with_config_defaults
from transformers.utils.output_capturing import capture_outputs

from .config import is_swiftkv

RowSelection = slice | torch.Tensor | None

# True while the student's later layers run. Student-only weights that distillation may add to the
# later layers (`swiftkv.distill.core.trainable`) read it, so the teacher path keeps the frozen originals.
# A module global rather than a ContextVar: torch.compile reads a global as a guarded constant (one graph
# per path), while ContextVar.get is untraceable and broke every compiled decoder layer at each adapter
# (torch 2.13, N = 15: 1,256 graph pieces per step). Distillation sets it on one thread; the backward's
# recomputation re-enters it (`distill/parallel/sharding.py`).
_student_path = False


def on_student_path() -> bool:
    return _student_path


@contextmanager
def student_path() -> Iterator[None]:
    global _student_path
    before, _student_path = _student_path, True
    try:
        yield
    finally:
        _student_path = before


def swiftkv_parameters(model: nn.Module) -> dict[str, nn.Parameter]:
    """The parameters SwiftKV adds (q/k/v_proj_swiftkv, norm_swiftkv, Qwen3's q/k_norm_swiftkv): the only
    ones distillation trains."""
    return {name: p for name, p in model.named_parameters() if "swiftkv" in name}


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on one tensor [batch, heads, seq, head_dim] (transformers rotates q and k together)."""
    return x * cos.unsqueeze(1) + rotate_half(x) * sin.unsqueeze(1)


def attend(module: nn.Module, query, key, value, attention_mask, **kwargs):
    """A later layer's attention over its group's K/V through the config's attention implementation (eager
    where none is set), called as transformers' own attention layers call it; every family's student uses it."""
    attention = ALL_ATTENTION_FUNCTIONS.get_interface(
        module.config._attn_implementation, eager_attention_forward
    )
    return attention(
        module,
        query,
        key,
        value,
        attention_mask,
        dropout=0.0 if not module.training else module.attention_dropout,
        scaling=module.scaling,
        **kwargs,
    )


def rows_to_keep(logits_to_keep: int | torch.Tensor) -> RowSelection:
    """Positions whose logits are wanted, as transformers' `logits_to_keep` means it (0 = all)."""
    if isinstance(logits_to_keep, int):
        return None if logits_to_keep == 0 else slice(-logits_to_keep, None)
    return logits_to_keep


# --------------------------------------------------------------------------------------------------
# Attention and decoder layer
# --------------------------------------------------------------------------------------------------


class SwiftKVAttentionMixin:
    """Adds the SwiftKV projections and a student forward that attends over K/V computed elsewhere.
    `qk_norm` families (Qwen3) normalise each query/key head before RoPE, so their student carries
    its own norms too: q_norm_swiftkv per later layer, k_norm_swiftkv per group owner."""

    qk_norm = False
    # A group owner's modules that the model calls for every token outside the layer's forward
    # (`swiftkv_key_values`); FSDP makes them a unit of their own (`distill.sharding`).
    swiftkv_group_modules = ("k_proj_swiftkv", "k_norm_swiftkv", "v_proj_swiftkv")

    def __init__(self, config, layer_idx: int):
        super().__init__(config, layer_idx)
        if config.num_key_value_layers is None or layer_idx < config.num_key_value_layers:
            return
        bias = self.q_proj.bias is not None
        q_out, kv_out = self.q_proj.out_features, self.k_proj.out_features
        self.q_proj_swiftkv = nn.Linear(config.hidden_size, q_out, bias=bias)
        if self.qk_norm:
            self.q_norm_swiftkv = type(self.q_norm)(self.head_dim, eps=config.rms_norm_eps)
        if config.is_kv_owner(layer_idx):
            self.k_proj_swiftkv = nn.Linear(config.hidden_size, kv_out, bias=bias)
            self.v_proj_swiftkv = nn.Linear(config.hidden_size, kv_out, bias=bias)
            if self.qk_norm:
                self.k_norm_swiftkv = type(self.k_norm)(self.head_dim, eps=config.rms_norm_eps)
        if config.swiftkv_trimmed:  # the original q/k/v (and their norms) of later layers are dead weight
            del self.q_proj, self.k_proj, self.v_proj
            if self.qk_norm:
                del self.q_norm, self.k_norm

    def forward(
        self,
        hidden_states,
        position_embeddings=None,
        attention_mask=None,
        past_key_values=None,
        swiftkv_kv: tuple[torch.Tensor, torch.Tensor] | None = None,
        **kwargs,
    ):
        if swiftkv_kv is None:
            return super().forward(
                hidden_states, position_embeddings, attention_mask, past_key_values, **kwargs
            )
        input_shape = hidden_states.shape[:-1]
        query = self.q_proj_swiftkv(hidden_states).view(*input_shape, -1, self.head_dim)
        if self.qk_norm:
            query = self.q_norm_swiftkv(query)
        query = apply_rope(query.transpose(1, 2), *position_embeddings)
        key, value = swiftkv_kv
        out, weights = attend(
            self,
            query,
            key,
            value,
            attention_mask,
            sliding_window=getattr(self, "sliding_window", None),
            **kwargs,
        )
        return self.o_proj(out.reshape(*input_shape, -1).contiguous()), weights

    def swiftkv_key_value_heads(self, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """This group owner's pre-RoPE K (after k_norm_swiftkv where the family has one) and V from
        s = norm_swiftkv(h_N), per head: [..., kv_heads, head_dim]."""
        shape = (*s.shape[:-1], -1, self.head_dim)
        key = self.k_proj_swiftkv(s).view(shape)
        if self.qk_norm:
            key = self.k_norm_swiftkv(key)
        return key, self.v_proj_swiftkv(s).view(shape)

    def swiftkv_key_value(self, s: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """This group owner's K (RoPE'd at each token's position) and V, [batch, heads, seq, head_dim]."""
        key, value = self.swiftkv_key_value_heads(s)
        return apply_rope(key.transpose(1, 2), cos, sin), value.transpose(1, 2)


class SwiftKVDecoderLayerMixin:
    """Unchanged layer math; its attention (`attention_class`) understands `swiftkv_kv=` (passed through
    **kwargs)."""

    attention_class: type

    def __init__(self, config, layer_idx: int):
        super().__init__(config, layer_idx)
        self.self_attn = self.attention_class(config, layer_idx)


# --------------------------------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------------------------------


@dataclass
class EarlyOutput:
    """What `late` needs after layers < N ran: h_N and the per-token context of the batch."""

    hidden_states: torch.Tensor  # h_N, the residual stream entering layer N
    position_embeddings: tuple[torch.Tensor, torch.Tensor] | torch.Tensor  # (cos, sin); DeepSeek-V2: complex
    masks: dict  # layer type -> attention mask (None lets SDPA use its causal kernel)
    cache_position: torch.Tensor  # absolute position of each query row in the cache, [seq]
    past_key_values: Cache | None


@dataclass
class PairHidden:
    """Teacher and student over the same tokens (`forward_pair`)."""

    teacher: torch.Tensor  # final hidden states after the final norm, selected rows, [rows, H]
    student: torch.Tensor
    teacher_probe: torch.Tensor | None = None  # residual stream entering the probe layer, all rows, [B*S, H]
    student_probe: torch.Tensor | None = None


class SwiftKVModelMixin:
    """The decoder stack. `hf_model_class` is the transformers model whose pieces are reused."""

    hf_model_class: type
    decoder_layer_class: type
    norm_class: type
    rotary_class: type

    def __init__(self, config):
        # Skip the HF model's own __init__ (it would build its layer classes) but keep PreTrainedModel's.
        super(self.hf_model_class, self).__init__(config)
        self.padding_idx = config.pad_token_id
        self.vocab_size = config.vocab_size
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, self.padding_idx)
        self.layers = nn.ModuleList(
            [self.decoder_layer_class(config, i) for i in range(config.num_hidden_layers)]
        )
        self.norm = self.norm_class(config.hidden_size, eps=config.rms_norm_eps)
        if config.num_key_value_layers is not None:
            self.norm_swiftkv = self.norm_class(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = self.rotary_class(config=config)
        self.gradient_checkpointing = False
        self.post_init()

    # -- pieces ------------------------------------------------------------------------------------

    @property
    def split_layer(self) -> int:
        """First layer that `late` runs: N for a SwiftKV config, otherwise all layers are early."""
        n = self.config.num_key_value_layers
        return self.config.num_hidden_layers if n is None else n

    def layer_type(self, i: int) -> str:
        types = getattr(self.config, "layer_types", None)
        return types[i] if types else "full_attention"

    def build_masks(self, inputs_embeds, attention_mask, past_key_values, position_ids) -> dict:
        if isinstance(attention_mask, dict):  # `generate` may have prepared them already
            return attention_mask
        kwargs = dict(
            config=self.config,
            inputs_embeds=inputs_embeds,
            attention_mask=attention_mask,
            past_key_values=past_key_values,
            position_ids=position_ids,
        )
        masks = {"full_attention": create_causal_mask(**kwargs)}
        if any(self.layer_type(i) == "sliding_attention" for i in range(self.config.num_hidden_layers)):
            masks["sliding_attention"] = create_sliding_window_causal_mask(**kwargs)
        return masks

    def embed_and_early(
        self,
        input_ids=None,
        attention_mask=None,
        position_ids=None,
        past_key_values=None,
        inputs_embeds=None,
        **kwargs,
    ) -> EarlyOutput:
        """Embedding and layers < N: identical for teacher and student."""
        if (input_ids is None) ^ (inputs_embeds is not None):
            raise ValueError("You must specify exactly one of input_ids or inputs_embeds")
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        past_seen = past_key_values.get_seq_length() if past_key_values is not None else 0
        cache_position = torch.arange(inputs_embeds.shape[1], device=inputs_embeds.device) + past_seen
        if position_ids is None:
            position_ids = cache_position.unsqueeze(0)
        masks = self.build_masks(inputs_embeds, attention_mask, past_key_values, position_ids)
        position_embeddings = self.rotary_emb(inputs_embeds, position_ids=position_ids)
        hidden = inputs_embeds
        for i in range(self.split_layer):
            hidden = self.layers[i](
                hidden,
                attention_mask=masks[self.layer_type(i)],
                position_embeddings=position_embeddings,
                position_ids=position_ids,
                past_key_values=past_key_values,
                **kwargs,
            )
        return EarlyOutput(hidden, position_embeddings, masks, cache_position, past_key_values)

    def late(
        self,
        early: EarlyOutput,
        student: bool,
        keep_rows: RowSelection = None,
        layer_inputs: dict[int, torch.Tensor] | None = None,
        **kwargs,
    ) -> torch.Tensor:
        """Layers >= N on h_N (before the final norm). The teacher runs them as transformers does;
        the student takes every later layer's K/V from norm_swiftkv(h_N) and, with `keep_rows`,
        runs the later layers on the kept rows only. `layer_inputs`, if given, maps later-layer
        indices to None and gets the residual stream entering each of those layers filled in."""
        if student:
            return self.late_student(early, keep_rows, layer_inputs, **kwargs)
        self.check_teacher_weights()
        hidden = early.hidden_states
        for i in range(self.split_layer, self.config.num_hidden_layers):
            record_input(layer_inputs, i, hidden)
            hidden = self.layers[i](
                hidden,
                attention_mask=early.masks[self.layer_type(i)],
                position_embeddings=early.position_embeddings,
                past_key_values=early.past_key_values,
                **kwargs,
            )
        return hidden if keep_rows is None else hidden[:, keep_rows]

    def late_student(
        self, early: EarlyOutput, keep_rows: RowSelection, layer_inputs=None, **kwargs
    ) -> torch.Tensor:
        kv_per_group = self.swiftkv_key_values(early)
        hidden, position_embeddings, masks = select_rows(early, keep_rows)
        with student_path():
            for i in self.config.later_layers:
                record_input(layer_inputs, i, hidden)
                hidden = self.layers[i](
                    hidden,
                    attention_mask=masks[self.layer_type(i)],
                    position_embeddings=position_embeddings,
                    swiftkv_kv=kv_per_group[self.config.group_of(i)],
                    **kwargs,
                )
        return hidden

    def forward_pair(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        rows: torch.Tensor | None = None,
        probe_layer: int | None = None,
        shared_prefix: bool = True,
    ) -> PairHidden:
        """The teacher's and the student's final hidden states (after the final norm) over the same
        tokens, with layers < N computed once for both: the SwiftKV math every consumer of a
        teacher/student pair uses (calibration, distillation, evaluation).

        `rows` selects flat positions of [batch * seq] (None: all). The student runs its later layers
        only on the sequence positions some row needs (the prefill skip; exact, because its later
        K/V come from every token's h_N). The teacher and the early layers run without grad; the
        student follows the caller's grad mode. `probe_layer` also returns, for every position, the
        residual stream entering that later layer. `shared_prefix=False` runs layers < N again for
        the student (the reference way; same result)."""
        probes = (
            {"teacher": {probe_layer: None}, "student": {probe_layer: None}}
            if probe_layer is not None
            else {}
        )
        with torch.no_grad():
            early = self.embed_and_early(input_ids=input_ids, position_ids=position_ids)
            teacher = flat_rows(self.late(early, student=False, layer_inputs=probes.get("teacher")), rows)
        if not shared_prefix:
            early = self.embed_and_early(input_ids=input_ids, position_ids=position_ids)
        positions, student_rows = student_selection(rows, input_ids.shape[1], probe_layer is None)
        student = self.late(early, student=True, keep_rows=positions, layer_inputs=probes.get("student"))
        pair = PairHidden(self.norm(teacher), self.norm(flat_rows(student, student_rows)))
        if probes:
            pair.teacher_probe = flat_rows(probes["teacher"][probe_layer], None)
            pair.student_probe = flat_rows(probes["student"][probe_layer], None)
        return pair

    def swiftkv_key_values(self, early: EarlyOutput) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """K/V of each AcrossKV group for all tokens, appended to the group's cache slot."""
        s = self.norm_swiftkv(early.hidden_states)
        key_values = []
        for owner in self.config.kv_owners:
            key, value = self.layers[owner].self_attn.swiftkv_key_value(s, *early.position_embeddings)
            if early.past_key_values is not None:
                key, value = early.past_key_values.update(key, value, self.config.cache_index(owner))
            key_values.append((key, value))
        return key_values

    def check_teacher_weights(self) -> None:
        check_teacher_contained(self.config)

    # -- forward -----------------------------------------------------------------------------------

    @merge_with_config_defaults
    @capture_outputs
    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        position_ids=None,
        past_key_values=None,
        inputs_embeds=None,
        use_cache=None,
        keep_rows: RowSelection = None,
        swiftkv: bool | None = None,
        **kwargs,
    ):
        """`swiftkv` picks the path for this call (True: student, False: teacher); None uses
        `config.swiftkv`, the folder's default."""
        if use_cache and past_key_values is None:
            past_key_values = DynamicCache(config=self.config)
        early = self.embed_and_early(
            input_ids, attention_mask, position_ids, past_key_values, inputs_embeds, **kwargs
        )
        wanted = self.config.swiftkv if swiftkv is None else swiftkv
        student = bool(wanted) and is_swiftkv(self.config)
        hidden = self.late(early, student=student, keep_rows=keep_rows, **kwargs)
        return BaseModelOutputWithPast(
            last_hidden_state=self.norm(hidden), past_key_values=past_key_values if use_cache else None
        )


def check_teacher_contained(config) -> None:
    """Refuse the teacher path of a folder that does not hold its teacher (trimmed, or later layers
    distilled for the student): it would silently compute something that is neither model."""
    why = config.teacher_missing if is_swiftkv(config) else None
    if why:
        raise ValueError(
            f"this SwiftKV checkpoint cannot run its teacher path (swiftkv=False): {why}. It can only "
            "run with swiftkv=True; use the source model it was converted from as the teacher."
        )


def record_input(layer_inputs: dict | None, layer: int, hidden: torch.Tensor) -> None:
    if layer_inputs is not None and layer in layer_inputs:
        layer_inputs[layer] = hidden


def student_selection(rows: torch.Tensor | None, seq_len: int, may_skip: bool):
    """(sequence positions the student's later layers run on, flat rows of their [batch * positions]
    output that `rows` asks for). Without `rows`, or when every row is needed (`may_skip` False),
    the later layers run on every position."""
    if rows is None or not may_skip:
        return None, rows
    positions = torch.unique(rows % seq_len)
    return positions, (rows // seq_len) * len(positions) + torch.searchsorted(positions, rows % seq_len)


def flat_rows(hidden: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
    """[batch, seq, H] -> [batch * seq, H], restricted to `rows` of the flat index if given."""
    flat = hidden.reshape(-1, hidden.shape[-1])
    return flat if rows is None else flat[rows]


def select_rows(early: EarlyOutput, keep_rows: RowSelection):
    """h_N, RoPE tables and masks restricted to the query rows in `keep_rows` (all rows if None)."""
    if keep_rows is None:
        return early.hidden_states, early.position_embeddings, early.masks
    hidden = early.hidden_states[:, keep_rows]
    rope = early.position_embeddings  # (cos, sin), or DeepSeek-V2's one complex tensor
    rope = rope[:, keep_rows] if isinstance(rope, torch.Tensor) else tuple(t[:, keep_rows] for t in rope)
    masks = {kind: rows_of_mask(mask, early, keep_rows, hidden.dtype) for kind, mask in early.masks.items()}
    return hidden, rope, masks


def rows_of_mask(mask, early: EarlyOutput, keep_rows, dtype) -> torch.Tensor:
    """A 4-D mask for the kept query rows. `None` meant "plain causal" to SDPA, which no longer holds
    once the query is a subset of rows, so it is rebuilt explicitly (additive, works for every kernel)."""
    if mask is not None:
        return mask[:, :, keep_rows]
    query_pos = early.cache_position[keep_rows]
    key_pos = torch.arange(int(early.cache_position[-1]) + 1, device=query_pos.device)
    allowed = key_pos[None, :] <= query_pos[:, None]
    additive = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return additive.masked_fill(~allowed, torch.finfo(dtype).min)[None, None]


# --------------------------------------------------------------------------------------------------
# Causal LM
# --------------------------------------------------------------------------------------------------


class SwiftKVForCausalLMMixin:
    hf_causal_lm_class: type
    model_class: type

    def __init__(self, config):
        # Skip the HF class's __init__ (it would build a plain LlamaModel/Qwen2Model first).
        super(self.hf_causal_lm_class, self).__init__(config)
        self.model = self.model_class(config)
        self.vocab_size = config.vocab_size
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def set_swiftkv(self, enabled: bool) -> None:
        """Set the default path of this model (True: student, False: the original teacher). A single
        call can choose instead: `model(ids, swiftkv=False)`, `model.generate(ids, swiftkv=False)`."""
        if enabled and not is_swiftkv(self.config):
            raise ValueError("this model has no SwiftKV layers (num_key_value_layers is not set)")
        if not enabled:
            check_teacher_contained(self.config)
        self.config.swiftkv = bool(enabled)

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        position_ids=None,
        past_key_values=None,
        inputs_embeds=None,
        labels=None,
        use_cache=None,
        logits_to_keep: int | torch.Tensor = 0,
        swiftkv: bool | None = None,
        **kwargs,
    ) -> CausalLMOutputWithPast:
        keep_rows = rows_to_keep(logits_to_keep)
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            keep_rows=keep_rows,
            swiftkv=swiftkv,
            **kwargs,
        )
        logits = self.lm_head(outputs.last_hidden_state)  # already restricted to `keep_rows` by the model
        loss = None
        if labels is not None:
            loss = self.loss_function(
                logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs
            )
        return CausalLMOutputWithPast(
            loss=loss,
            logits=logits,
            past_key_values=outputs.past_key_values,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )


# --------------------------------------------------------------------------------------------------
# One family's classes
# --------------------------------------------------------------------------------------------------


def swiftkv_causal_lm(
    prefix: str,
    base_type: str,
    config_class: type,
    qk_norm: bool,
    attention_mixin: type | None = None,
    model_mixin: type | None = None,
) -> type:
    """`<prefix>SwiftKVForCausalLM`: transformers' own classes of `base_type` (`<prefix>Attention`,
    `<prefix>DecoderLayer`, `<prefix>Model`, `<prefix>ForCausalLM`, `<prefix>RMSNorm`,
    `<prefix>RotaryEmbedding` in `transformers.models.<base_type>`) with the SwiftKV mixins above; each
    family's registry entry (`model.families`) builds its own from its traits. The classes are exported
    by the `swiftkv` package, which is where pickles and the folders' shim find them. `attention_mixin` and
    `model_mixin` replace the Llama-shaped SwiftKV attention and stack (multi-head latent attention: `mla`)."""
    hf = importlib.import_module(f"transformers.models.{base_type}.modeling_{base_type}")

    def make(name: str, mixin: type, **attributes) -> type:
        base = getattr(hf, f"{prefix}{name}")
        new = type(f"{prefix}SwiftKV{name}", (mixin, base), {"__module__": "swiftkv", **attributes})
        new.__qualname__ = new.__name__
        return new

    attention = make("Attention", attention_mixin or SwiftKVAttentionMixin, qk_norm=qk_norm)
    layer = make("DecoderLayer", SwiftKVDecoderLayerMixin, attention_class=attention)
    model = make(
        "Model",
        model_mixin or SwiftKVModelMixin,
        config_class=config_class,
        hf_model_class=getattr(hf, f"{prefix}Model"),
        decoder_layer_class=layer,
        norm_class=getattr(hf, f"{prefix}RMSNorm"),
        rotary_class=getattr(hf, f"{prefix}RotaryEmbedding"),
    )
    return make(
        "ForCausalLM",
        SwiftKVForCausalLMMixin,
        config_class=config_class,
        hf_causal_lm_class=getattr(hf, f"{prefix}ForCausalLM"),
        model_class=model,
    )
