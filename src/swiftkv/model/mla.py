"""SwiftKV on multi-head latent attention (MLA: DeepSeek-V2 and DeepSeek-V3).

MLA compresses each token's K/V into one latent per layer: c = kv_a_layernorm(kv_a_proj_with_mqa(x)) of
width `kv_lora_rank` (the part without position), plus one RoPE key k_rot of width `qk_rope_head_dim` shared
by every head. kv_b_proj decompresses c into each head's K (no position part) and V; a head's K is that
part followed by k_rot. transformers' DeepSeek models cache (c, RoPE(k_rot)) per layer.

The SwiftKV student, in ArcticTraining's tensor layout (so folders load both ways): each later layer's query
comes from its own `q_proj_swiftkv` (or `q_a_proj_swiftkv` -> `q_a_layernorm_swiftkv` -> `q_b_proj_swiftkv`
when q_lora_rank is set); each AcrossKV group owner computes the group's latent from s = norm_swiftkv(h_N)
with `kv_a_proj_with_mqa_swiftkv` and `kv_a_layernorm_swiftkv` and decompresses it with `kv_b_proj_swiftkv`.

Unlike the reference, whose cache holds every later layer's decompressed K/V (num_heads x (qk_head_dim +
v_head_dim) values per token and layer), the student's cache keeps each group's latent: one slot of
kv_lora_rank + qk_rope_head_dim values per group, in the teacher's cache format. A forward step reads the
slot and decompresses it once for the group's layers (they share kv_b_proj_swiftkv, so once is exact).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from .counts import AttentionCounts
from .inits import mean_linear
from .modeling import SwiftKVModelMixin, apply_rope, attend

# The modules of a layer's query (by whether q_lora_rank is set) and of its latent; ArcticTraining names their
# SwiftKV twins `<module>_swiftkv`. A later layer's teacher modules are dead weight for the student (--trim).
QUERY_MODULES = {False: ("q_proj",), True: ("q_a_proj", "q_a_layernorm", "q_b_proj")}
LATENT_MODULES = ("kv_a_proj_with_mqa", "kv_a_layernorm", "kv_b_proj")


def rope_rotate(x: torch.Tensor, position_embeddings, interleave: bool) -> torch.Tensor:
    """RoPE on one tensor [batch, heads, seq, rope_dim] as the family's teacher rotates q and k: DeepSeek-V2's
    complex rotation of interleaved pairs (position_embeddings: one complex tensor), DeepSeek-V3's cos/sin on
    interleaved pairs (`interleave`, its rope_interleave) or on halves."""
    if isinstance(position_embeddings, torch.Tensor):
        pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(pairs * position_embeddings.unsqueeze(1)).flatten(3).type_as(x)
    cos, sin = position_embeddings
    if not interleave:
        return apply_rope(x, cos, sin)
    cos, sin = (t[..., : t.shape[-1] // 2].unsqueeze(1) for t in (cos, sin))
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.cat([even * cos - odd * sin, odd * cos + even * sin], dim=-1)


class SwiftKVLatentAttentionMixin:
    """DeepSeek's attention plus the SwiftKV projections (ArcticTraining's names) and a student forward that
    attends over a group's decompressed latent (`swiftkv_kv`)."""

    swiftkv_group_modules = tuple(
        f"{module}_swiftkv" for module in LATENT_MODULES
    )  # see SwiftKVAttentionMixin

    def __init__(self, config, layer_idx: int):
        super().__init__(config, layer_idx)
        if config.num_key_value_layers is None or layer_idx < config.num_key_value_layers:
            return
        q_out = self.num_heads * self.qk_head_dim
        if self.q_lora_rank is None:
            self.q_proj_swiftkv = nn.Linear(self.hidden_size, q_out, bias=False)
        else:
            self.q_a_proj_swiftkv = nn.Linear(self.hidden_size, self.q_lora_rank, bias=config.attention_bias)
            self.q_a_layernorm_swiftkv = type(self.q_a_layernorm)(self.q_lora_rank)
            self.q_b_proj_swiftkv = nn.Linear(self.q_lora_rank, q_out, bias=False)
        if config.is_kv_owner(layer_idx):
            latent = self.kv_lora_rank + self.qk_rope_head_dim
            per_head = self.qk_nope_head_dim + self.v_head_dim
            self.kv_a_proj_with_mqa_swiftkv = nn.Linear(self.hidden_size, latent, bias=config.attention_bias)
            self.kv_a_layernorm_swiftkv = type(self.kv_a_layernorm)(self.kv_lora_rank)
            self.kv_b_proj_swiftkv = nn.Linear(self.kv_lora_rank, self.num_heads * per_head, bias=False)
        if config.swiftkv_trimmed:
            for name in (*QUERY_MODULES[self.q_lora_rank is not None], *LATENT_MODULES):
                delattr(self, name)

    @property
    def rope_interleave(self) -> bool:
        return bool(getattr(self.config, "rope_interleave", True))

    def forward(
        self,
        hidden_states,
        attention_mask=None,
        past_key_values=None,
        position_embeddings=None,
        swiftkv_kv: tuple[torch.Tensor, torch.Tensor] | None = None,
        **kwargs,
    ):
        if swiftkv_kv is None:
            return super().forward(
                hidden_states=hidden_states,
                attention_mask=attention_mask,
                past_key_values=past_key_values,
                position_embeddings=position_embeddings,
                **kwargs,
            )
        batch, seq = hidden_states.shape[:-1]
        query = self.swiftkv_query(hidden_states).view(batch, seq, -1, self.qk_head_dim).transpose(1, 2)
        q_pass, q_rot = torch.split(query, [self.qk_nope_head_dim, self.qk_rope_head_dim], dim=-1)
        query = torch.cat((q_pass, rope_rotate(q_rot, position_embeddings, self.rope_interleave)), dim=-1)
        key, value = swiftkv_kv
        out, weights = attend(self, query, key, value, attention_mask, **kwargs)
        return self.o_proj(out.reshape(batch, seq, -1).contiguous()), weights

    def swiftkv_query(self, x: torch.Tensor) -> torch.Tensor:
        if self.q_lora_rank is None:
            return self.q_proj_swiftkv(x)
        return self.q_b_proj_swiftkv(self.q_a_layernorm_swiftkv(self.q_a_proj_swiftkv(x)))

    def swiftkv_latent(self, s: torch.Tensor, position_embeddings) -> tuple[torch.Tensor, torch.Tensor]:
        """This group owner's latent from s = norm_swiftkv(h_N), in the teacher's cache format: the
        normalised part without position [batch, 1, seq, kv_lora_rank] and the RoPE'd shared key
        [batch, 1, seq, qk_rope_head_dim]."""
        batch, seq = s.shape[:-1]
        latent, k_rot = self.split_latent(self.kv_a_proj_with_mqa_swiftkv(s), self.kv_a_layernorm_swiftkv)
        latent = latent.view(batch, 1, seq, self.kv_lora_rank)
        k_rot = k_rot.view(batch, 1, seq, self.qk_rope_head_dim)
        return latent, rope_rotate(k_rot, position_embeddings, self.rope_interleave)

    def swiftkv_expand(self, latent: torch.Tensor, k_rot: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A group's K [batch, heads, seq, qk_head_dim] and V [batch, heads, seq, v_head_dim] from its latent
        (kv_b_proj_swiftkv; every head's K ends with the shared RoPE key)."""
        key, value = self.decompress(latent[:, 0], k_rot[:, 0], self.kv_b_proj_swiftkv)
        return key.transpose(1, 2), value.transpose(1, 2)

    def swiftkv_key_value_heads(self, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """This group owner's K before RoPE and V from s = norm_swiftkv(h_N), per head: [..., heads, qk_head_dim]
        and [..., heads, v_head_dim] (what the conversion compares with `teacher_key_value_heads`)."""
        latent, k_rot = self.split_latent(self.kv_a_proj_with_mqa_swiftkv(s), self.kv_a_layernorm_swiftkv)
        return self.decompress(latent, k_rot, self.kv_b_proj_swiftkv)

    def teacher_key_value_heads(self, compressed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """This layer's own K before RoPE and V per head from its kv_a_proj_with_mqa output `compressed`."""
        latent, k_rot = self.split_latent(compressed, self.kv_a_layernorm)
        return self.decompress(latent, k_rot, self.kv_b_proj)

    def split_latent(self, compressed: torch.Tensor, norm: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
        """kv_a_proj_with_mqa's output [..., kv_lora_rank + qk_rope_head_dim] -> the normalised part without
        position and the shared key before RoPE."""
        latent, k_rot = torch.split(compressed, [self.kv_lora_rank, self.qk_rope_head_dim], dim=-1)
        return norm(latent), k_rot

    def decompress(
        self, latent: torch.Tensor, k_rot: torch.Tensor, kv_b_proj: nn.Linear
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Each head's K [..., heads, qk_head_dim] (its part without position, then the shared key) and
        V [..., heads, v_head_dim] from a normalised latent [..., kv_lora_rank] and k_rot [..., qk_rope_head_dim]."""
        per_head = kv_b_proj(latent).unflatten(-1, (-1, self.qk_nope_head_dim + self.v_head_dim))
        k_pass, value = torch.split(per_head, [self.qk_nope_head_dim, self.v_head_dim], dim=-1)
        key = torch.cat((k_pass, k_rot.unsqueeze(-2).expand(*k_pass.shape[:-1], -1)), dim=-1)
        return key, value


class SwiftKVLatentModelMixin(SwiftKVModelMixin):
    """The decoder stack of an MLA family: each AcrossKV group's cache slot holds its latent."""

    def swiftkv_key_values(self, early) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each group's K/V for all tokens: its latent appended to the group's cache slot, then the whole
        slot decompressed."""
        s = self.norm_swiftkv(early.hidden_states)
        key_values = []
        for owner in self.config.kv_owners:
            attention = self.layers[owner].self_attn
            latent, k_rot = attention.swiftkv_latent(s, early.position_embeddings)
            if early.past_key_values is not None:
                latent, k_rot = early.past_key_values.update(latent, k_rot, self.config.cache_index(owner))
            key_values.append(attention.swiftkv_expand(latent, k_rot))
        return key_values


def latent_init_tensors(
    config, weights: Mapping[str, torch.Tensor], average_group: bool
) -> dict[str, torch.Tensor]:
    """ArcticTraining's DeepSeek init (its `post_create_model_callback`): each later layer's query modules
    (q_proj, or q_a_proj, q_a_layernorm and q_b_proj) copied from the layer; a group owner's latent modules
    (kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj) the group's mean ("mean") or the owner's own ("copy")."""
    g = config.key_value_group_size
    params = {}
    for i in config.later_layers:
        prefix = f"model.layers.{i}.self_attn"
        for module in QUERY_MODULES[config.q_lora_rank is not None]:
            params.update(mean_linear(f"{prefix}.{module}_swiftkv", [f"{prefix}.{module}"], weights))
        if config.is_kv_owner(i):
            members = range(i, i + g) if average_group else range(i, i + 1)
            for module in LATENT_MODULES:
                sources = [f"model.layers.{j}.self_attn.{module}" for j in members]
                params.update(mean_linear(f"{prefix}.{module}_swiftkv", sources, weights))
    return params


# --------------------------------------------------------------------------------------------------
# What latent attention computes and keeps per token (the FLOP model's and the memory plan's counts)
# --------------------------------------------------------------------------------------------------


def latent_projection_flops(config) -> dict[str, int]:
    """Multi-head latent attention's projections, as transformers' models and the SwiftKV student run them on
    every token: the query through q_proj, or q_a_proj then q_b_proj when `q_lora_rank` is set; the latent
    (kv_a_proj_with_mqa: `kv_lora_rank` plus the shared RoPE key) and its decompression into every head's K
    part and V (kv_b_proj); o_proj from the heads' V width."""
    hidden, heads, rank = config.hidden_size, config.num_attention_heads, config.kv_lora_rank
    if config.q_lora_rank is None:
        query = 2 * hidden * heads * config.qk_head_dim
    else:
        query = 2 * hidden * config.q_lora_rank + query_second_factor_flops(config)
    latent = 2 * hidden * (rank + config.qk_rope_head_dim)
    decompress = 2 * rank * heads * (config.qk_nope_head_dim + config.v_head_dim)
    return {"q": query, "kv": latent + decompress, "o": 2 * heads * config.v_head_dim * hidden}


def query_second_factor_flops(config) -> int:
    """FLOPs per token of q_b_proj, the low-rank query's second factor (0 without `q_lora_rank`)."""
    if config.q_lora_rank is None:
        return 0
    return 2 * config.q_lora_rank * config.num_attention_heads * config.qk_head_dim


def latent_group_kv_values(config) -> int:
    """Values per token an AcrossKV group keeps for its layers' backward: its latent and every head's
    decompressed K and V."""
    head = config.qk_head_dim + config.v_head_dim
    return config.kv_lora_rank + config.qk_rope_head_dim + config.num_attention_heads * head


LATENT_ATTENTION = AttentionCounts(
    projection_flops=latent_projection_flops,
    # its q/k heads are qk_nope + qk_rope wide, its V heads `v_head_dim`
    score_flops=lambda config, keys: (
        2 * config.num_attention_heads * (config.qk_head_dim + config.v_head_dim) * keys
    ),
    group_kv_values=latent_group_kv_values,
    query_second_factor_flops=query_second_factor_flops,
)
