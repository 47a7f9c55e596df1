"""An independent, deliberately plain implementation of the SwiftKV student math (SingleInputKV and
AcrossKV as the paper, arXiv 2410.03960, describes them), written with torch ops only, to check the
model against. Slow and obvious on purpose. The Mixture-of-Experts families' later layers keep their
original MoE block: `moe_mlp` routes each token through its top-k experts one by one, as the Qwen-MoE
and Mixtral model cards describe it."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """x: [seq, heads, head_dim]; rotate-half RoPE at each token's position."""
    dim = x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    angles = positions[:, None].float() * inv_freq[None]
    cos, sin = torch.cat([angles, angles], -1).cos()[:, None], torch.cat([angles, angles], -1).sin()[:, None]
    half = dim // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos + rotated * sin


def causal_gqa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor):
    """q: [sq, H, d], k/v: [sk, Hkv, d]; query at position p sees keys at positions <= p."""
    repeat = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) / q.shape[-1] ** 0.5
    scores = scores.masked_fill(k_pos[None, None, :] > q_pos[None, :, None], float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


def linear(module, x):
    return F.linear(x, module.weight, module.bias)


def student_logits(model, input_ids: torch.Tensor, h_n: torch.Tensor) -> torch.Tensor:
    """Logits of one sequence [seq] under the SwiftKV student, given h_N [seq, hidden] (the residual
    stream entering layer N, which the teacher computes identically). Qwen3 (the issue's math):
    K = k_norm_swiftkv(k_proj_swiftkv(s)) and Q = q_norm_swiftkv(q_proj_swiftkv(x)), per head, before
    RoPE; V without a norm."""
    config = model.config
    eps, theta = config.rms_norm_eps, config.rope_parameters["rope_theta"]
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    qk_norm = config.model_type in ("qwen3_swiftkv", "qwen3_moe_swiftkv")
    positions = torch.arange(len(input_ids))
    s = rms_norm(h_n, model.model.norm_swiftkv.weight, eps)
    h = h_n
    for j in config.later_layers:
        layer = model.model.layers[j]
        owner = model.model.layers[config.kv_owner(j)].self_attn
        k = linear(owner.k_proj_swiftkv, s).view(-1, kv_heads, head_dim)
        if qk_norm:
            k = rms_norm(k, owner.k_norm_swiftkv.weight, eps)
        k = rope(k, positions, theta)
        v = linear(owner.v_proj_swiftkv, s).view(-1, kv_heads, head_dim)
        x = rms_norm(h, layer.input_layernorm.weight, eps)
        q = linear(layer.self_attn.q_proj_swiftkv, x).view(-1, heads, head_dim)
        if qk_norm:
            q = rms_norm(q, layer.self_attn.q_norm_swiftkv.weight, eps)
        q = rope(q, positions, theta)
        attn = causal_gqa(q, k, v, positions, positions).reshape(len(input_ids), -1)
        h = h + linear(layer.self_attn.o_proj, attn)
        x = rms_norm(h, layer.post_attention_layernorm.weight, eps)
        h = h + (moe_mlp(config, layer.mlp, x) if is_moe_layer(config, j) else dense_mlp(layer.mlp, x))
    return linear(model.lm_head, rms_norm(h, model.model.norm.weight, eps))


def dense_mlp(mlp, x: torch.Tensor) -> torch.Tensor:
    return linear(mlp.down_proj, F.silu(linear(mlp.gate_proj, x)) * linear(mlp.up_proj, x))


def is_moe_layer(config, layer: int) -> bool:
    """Mixtral: every layer. Qwen-MoE: every `decoder_sparse_step`-th layer not in `mlp_only_layers`."""
    base = config.model_type.removesuffix("_swiftkv")
    if base == "mixtral":
        return True
    if base not in ("qwen3_moe", "qwen2_moe"):
        return False
    only_dense = config.mlp_only_layers or []
    return (
        config.num_experts > 0 and layer not in only_dense and (layer + 1) % config.decoder_sparse_step == 0
    )


def moe_mlp(config, block, x: torch.Tensor) -> torch.Tensor:
    """x: [seq, hidden]. Router softmax over all experts, the top k kept (renormalised for Mixtral and
    Qwen with norm_topk_prob), each kept expert's SwiGLU weighted by its probability; Qwen2-MoE adds its
    shared expert scaled by sigmoid(shared_expert_gate(x)). Expert e's fused weights: gate_up_proj[e] is
    [gate; up] stacked along the output, down_proj[e] maps back to hidden."""
    base = config.model_type.removesuffix("_swiftkv")
    k = config.num_experts_per_tok
    renormalise = base == "mixtral" or config.norm_topk_prob
    probabilities = (x @ block.gate.weight.T).float().softmax(-1)
    gate_up, down = block.experts.gate_up_proj, block.experts.down_proj
    width = down.shape[-1]
    out = torch.zeros_like(x)
    for t in range(len(x)):
        top, experts = probabilities[t].topk(k)
        if renormalise:
            top = top / top.sum()
        for weight, e in zip(top.tolist(), experts.tolist(), strict=True):
            projected = gate_up[e] @ x[t]
            out[t] += weight * (down[e] @ (F.silu(projected[:width]) * projected[width:]))
    if base == "qwen2_moe":
        out = out + torch.sigmoid(x @ block.shared_expert_gate.weight.T) * dense_mlp(block.shared_expert, x)
    return out


# -- multi-head latent attention (DeepSeek-V2/V3), from the DeepSeek-V2 paper (arXiv 2405.04434) and
# YaRN (arXiv 2309.00071) ----------------------------------------------------------------------------

MLA_NORM_EPS = 1e-6  # DeepSeek builds q_a_layernorm and kv_a_layernorm with the default epsilon


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 0.1 * mscale * math.log(scale) + 1.0 if scale > 1 else 1.0


def mla_rope_frequencies(config) -> tuple[torch.Tensor, float]:
    """(inverse frequencies of the RoPE key's qk_rope_head_dim, the factor on cos/sin). YaRN: each frequency
    blends its extrapolated (1/base^(2i/d)) and interpolated (divided by `factor`) value, by a ramp between the
    dimensions whose wavelengths turn beta_fast and beta_slow times over the original context."""
    rope, dim = config.rope_parameters, config.qk_rope_head_dim
    base = rope["rope_theta"]
    extrapolated = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    if rope.get("rope_type", "default") == "default":
        return extrapolated, 1.0
    factor, original = rope["factor"], rope["original_max_position_embeddings"]

    def dimension(turns: float) -> float:
        return dim * math.log(original / (turns * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(dimension(rope["beta_fast"])), 0)
    high = min(math.ceil(dimension(rope["beta_slow"])), dim - 1)
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / max(high - low, 1e-3)).clamp(0, 1)
    inv_freq = extrapolated / factor * ramp + extrapolated * (1 - ramp)
    return inv_freq, yarn_mscale(factor, rope["mscale"]) / yarn_mscale(factor, rope["mscale_all_dim"])


def mla_softmax_scale(config) -> float:
    """1/sqrt(q/k head width), times YaRN's mscale(factor, mscale_all_dim)^2 under a scaled RoPE."""
    scale = (config.qk_nope_head_dim + config.qk_rope_head_dim) ** -0.5
    rope = config.rope_parameters
    if rope.get("rope_type", "default") != "default" and rope.get("mscale_all_dim"):
        scale *= yarn_mscale(rope["factor"], rope["mscale_all_dim"]) ** 2
    return scale


def mla_rope(x: torch.Tensor, positions: torch.Tensor, config) -> torch.Tensor:
    """x: [seq, heads, qk_rope_head_dim]. DeepSeek rotates neighbouring pairs (x_2i, x_2i+1) (V2 always, V3
    with rope_interleave), else the halves (x_i, x_i+d/2); each pair by its frequency times the position."""
    inv_freq, factor = mla_rope_frequencies(config)
    angles = positions[:, None].float() * inv_freq[None]
    cos, sin = (angles.cos() * factor)[:, None], (angles.sin() * factor)[:, None]
    interleaved = config.model_type.startswith("deepseek_v2") or getattr(config, "rope_interleave", True)
    first, second = (x[..., 0::2], x[..., 1::2]) if interleaved else x.chunk(2, dim=-1)
    return torch.cat([first * cos - second * sin, first * sin + second * cos], dim=-1)


def mla_student_logits(model, input_ids: torch.Tensor, h_n: torch.Tensor) -> torch.Tensor:
    """Logits of one sequence [seq] under an MLA SwiftKV student, given h_N [seq, hidden]: each group's
    latent from s = norm_swiftkv(h_N) (kv_a_proj_with_mqa_swiftkv: a compressed part, normalised by
    kv_a_layernorm_swiftkv, and the RoPE key), decompressed by kv_b_proj_swiftkv into every head's K (its
    part, then the shared RoPE key) and V; each later layer's query from q_proj_swiftkv (or q_a_proj_swiftkv,
    q_a_layernorm_swiftkv, q_b_proj_swiftkv); DeepSeek's MLP (dense before first_k_dense_replace)."""
    config = model.config
    eps, heads = config.rms_norm_eps, config.num_attention_heads
    nope, rope_dim, v_dim = config.qk_nope_head_dim, config.qk_rope_head_dim, config.v_head_dim
    seq = len(input_ids)
    positions = torch.arange(seq)
    s = rms_norm(h_n, model.model.norm_swiftkv.weight, eps)
    h = h_n
    for j in config.later_layers:
        layer = model.model.layers[j]
        owner = model.model.layers[config.kv_owner(j)].self_attn
        compressed, k_rot = linear(owner.kv_a_proj_with_mqa_swiftkv, s).split(
            [config.kv_lora_rank, rope_dim], -1
        )
        compressed = rms_norm(compressed, owner.kv_a_layernorm_swiftkv.weight, MLA_NORM_EPS)
        k_pass, v = (
            linear(owner.kv_b_proj_swiftkv, compressed)
            .view(seq, heads, nope + v_dim)
            .split([nope, v_dim], -1)
        )
        k = torch.cat([k_pass, mla_rope(k_rot[:, None], positions, config).expand(seq, heads, rope_dim)], -1)
        x = rms_norm(h, layer.input_layernorm.weight, eps)
        attention = layer.self_attn
        if config.q_lora_rank is None:
            q = linear(attention.q_proj_swiftkv, x)
        else:
            q_a = rms_norm(
                linear(attention.q_a_proj_swiftkv, x), attention.q_a_layernorm_swiftkv.weight, MLA_NORM_EPS
            )
            q = linear(attention.q_b_proj_swiftkv, q_a)
        q_pass, q_rot = q.view(seq, heads, nope + rope_dim).split([nope, rope_dim], -1)
        q = torch.cat([q_pass, mla_rope(q_rot, positions, config)], -1)
        scores = torch.einsum("qhd,khd->hqk", q, k) * mla_softmax_scale(config)
        scores = scores.masked_fill(positions[None, None, :] > positions[None, :, None], float("-inf"))
        attn = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(seq, -1)
        h = h + linear(attention.o_proj, attn)
        x = rms_norm(h, layer.post_attention_layernorm.weight, eps)
        dense = j < config.first_k_dense_replace
        h = h + (dense_mlp(layer.mlp, x) if dense else deepseek_moe(config, layer.mlp, x))
    return linear(model.lm_head, rms_norm(h, model.model.norm.weight, eps))


def deepseek_moe(config, block, x: torch.Tensor) -> torch.Tensor:
    """x: [seq, hidden]. DeepSeek's routed experts plus its shared experts (one SwiGLU MLP). Experts come in
    n_group groups of which topk_group are kept per token; the top k experts of the kept groups are chosen.
    V2: softmax scores, a group ranked by its best expert, weights = scores times routed_scaling_factor.
    V3: sigmoid scores; the choice (not the weights) adds the correction bias, a group ranked by its two best
    choices; weights = the chosen scores, renormalised (norm_topk_prob), times routed_scaling_factor."""
    v3 = config.model_type.startswith("deepseek_v3")
    experts, k = config.n_routed_experts, config.num_experts_per_tok
    groups, kept_groups = config.n_group or 1, config.topk_group or 1
    logits = x.float() @ block.gate.weight.float().T
    scores = logits.sigmoid() if v3 else logits.softmax(-1)
    choice = scores + block.gate.e_score_correction_bias if v3 else scores
    greedy = not v3 and config.topk_method == "greedy"
    gate_up, down = block.experts.gate_up_proj, block.experts.down_proj
    width = down.shape[-1]
    out = torch.zeros_like(x)
    for t in range(len(x)):
        ranked = choice[t].view(groups, experts // groups)
        rank = ranked.topk(2, -1).values.sum(-1) if v3 else ranked.max(-1).values
        allowed = torch.zeros(groups, dtype=torch.bool)
        allowed[rank.topk(kept_groups).indices] = True
        allowed = allowed.repeat_interleave(experts // groups) | greedy
        chosen = choice[t].masked_fill(~allowed, float("-inf")).topk(k).indices
        weights = scores[t, chosen]
        if v3 and config.norm_topk_prob:
            weights = weights / weights.sum()
        for weight, e in zip((weights * config.routed_scaling_factor).tolist(), chosen.tolist(), strict=True):
            projected = gate_up[e] @ x[t]
            out[t] += weight * (down[e] @ (F.silu(projected[:width]) * projected[width:]))
    return out + dense_mlp(block.shared_experts, x)
