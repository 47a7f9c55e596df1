"""An independent, deliberately plain implementation of the SwiftKV student math (SingleInputKV and
AcrossKV as the paper, arXiv 2410.03960, describes them), written with torch ops only, to check the
model against. Slow and obvious on purpose. The Mixture-of-Experts families' later layers keep their
original MoE block: `moe_mlp` routes each token through its top-k experts one by one, as the Qwen-MoE
and Mixtral model cards describe it."""

from __future__ import annotations

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
