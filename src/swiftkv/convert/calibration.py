"""Calibration for conversion: the teacher's activations on a few thousand tokens, the lstsq init
fitted to them, and how well an init reproduces the teacher on held-out tokens.

lstsq (ours): each AcrossKV group's k/v_proj_swiftkv <- the ridge least-squares map from
s = norm_swiftkv(h_N) to the teacher's pre-RoPE K/V of the group's layers. The student then starts
with K/V close to the teacher's, which distillation would otherwise have to learn.

Families with a per-head K norm (Qwen3: K = k_norm(k_proj(x)) before RoPE) are fitted on K *after*
the norm, the K attention actually uses: the target is the group's mean post-norm K divided, per
head dimension, by k_norm_swiftkv's weight (the group's mean k_norm). The student computes
k_norm_swiftkv(W s) = w * (W s) / rms(W s); with W s fitted to a target of unit RMS per head, the
RMS division is nearly the identity and the weight w restores the teacher's post-norm K. Fitting
the pre-norm k_proj output instead would spend the linear map on each token's K magnitude, which
the norm throws away, and weight the fit towards large-norm tokens; fitting the post-norm K itself
would apply w twice. V has no norm and is fitted as for the other families.

Multi-head latent attention (DeepSeek-V2/V3) has no K/V projections: a group owner computes the group's
latent [c; k_rot] = kv_a_proj_with_mqa_swiftkv(s), normalises c (kv_a_layernorm_swiftkv) and decompresses
it (kv_b_proj_swiftkv). lstsq is the mean init (ArcticTraining's: queries copied, the latent modules the
group's mean) with kv_a_proj_with_mqa_swiftkv replaced by a ridge fit from s to the group's teacher latents
(`latent_params`). As for Qwen3's K, c counts after the norm: the target's direction is the group's mean
post-norm c divided by kv_a_layernorm_swiftkv's weight, its scale the group's mean pre-norm RMS, and each
token weighs the inverse of that scale in the fit, so that a token counts by the direction the norm keeps,
not its magnitude, and the map stays linear in the teacher's pre-norm latent: at G = 1 the target is that
latent itself, which an exactly linear latent fits exactly. k_rot has no norm; it is fitted before RoPE,
as the families' K: RoPE multiplies each position's key by a rotation (times YaRN's attention factor, the
same at every position), so the squared error after RoPE is that before it times a constant.
The queries are copied in every family: lstsq fits only what a group shares.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from tqdm import tqdm

from ..data.mixture import read_data
from ..data.tokens import tokenize
from ..metrics import agreement_stats
from ..model.mla import SwiftKVLatentAttentionMixin, latent_init_tensors
from ..model.modeling import swiftkv_parameters

BLOCK_LEN = 512


@dataclass
class TeacherStats:
    """Teacher activations over all calibration tokens (rows = tokens)."""

    h_n: torch.Tensor  # residual stream entering layer N, [tokens, hidden]
    # later layer -> pre-RoPE K (after k_norm, Qwen3), [tokens, kv_heads * head_dim], and V
    keys: dict[int, torch.Tensor] = field(default_factory=dict)
    values: dict[int, torch.Tensor] = field(default_factory=dict)
    # latent attention instead (no K/V projections): later layer -> its kv_a_proj_with_mqa output, the latent
    # before kv_a_layernorm and RoPE, [tokens, kv_lora_rank + qk_rope_head_dim]
    latents: dict[int, torch.Tensor] = field(default_factory=dict)


def token_blocks(
    tokenizer, source: str, fit_tokens: int, eval_tokens: int, block_len: int = BLOCK_LEN
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Disjoint fit and held-out blocks of `block_len` tokens, packed from consecutive documents of
    the `--calib-data` source (read in order, no shuffle)."""
    wanted = -(-fit_tokens // block_len) + -(-eval_tokens // block_len)
    blocks, buffer = [], []
    for example in read_data(source, option="--calib-data"):
        document = tokenize(tokenizer, example)
        if document is None:
            continue
        buffer.extend(document.ids[: 4 * block_len])  # cap very long documents so the sample stays varied
        while len(buffer) >= block_len and len(blocks) < wanted:
            blocks.append(torch.tensor(buffer[:block_len]))
            buffer = buffer[block_len:]
        if len(blocks) == wanted:
            break
    if len(blocks) < 2:
        raise ValueError(
            f"--calib-data {source!r} yielded {len(blocks)} blocks of {block_len} tokens; "
            "expected at least 2 (one to fit, one held out)"
        )
    n_fit = max(1, min(len(blocks) - 1, -(-fit_tokens // block_len)))
    return blocks[:n_fit], blocks[n_fit:]


@torch.no_grad()
def teacher_stats(model, blocks: list[torch.Tensor], desc: str) -> TeacherStats:
    """Run the teacher path of a SwiftKV model and record h_N and every later layer's `recorded_modules`
    outputs (hooks on the teacher's own modules, which only the teacher path calls)."""
    later = model.config.later_layers
    h_n, records, hooks = [], {}, []
    for j in later:
        for stat, module in recorded_modules(model.model.layers[j].self_attn).items():
            records.setdefault(stat, {})[j] = []
            hooks.append(module.register_forward_hook(record_into(records[stat][j])))
    try:
        for block in tqdm(blocks, desc=desc, leave=False):
            early = model.model.embed_and_early(input_ids=block[None].to(model.device))
            h_n.append(early.hidden_states.flatten(0, 1).float())
            model.model.late(early, student=False)
    finally:
        for hook in hooks:
            hook.remove()
    recorded = {stat: {j: torch.cat(v) for j, v in layers.items()} for stat, layers in records.items()}
    return TeacherStats(torch.cat(h_n), **recorded)


def recorded_modules(attention) -> dict[str, torch.nn.Module]:
    """The teacher modules of a later layer whose outputs the fit and the measurement need, by TeacherStats
    field: the K that RoPE and attention see (k_norm's output where there is one) and V, or for latent
    attention its compressed latent."""
    if isinstance(attention, SwiftKVLatentAttentionMixin):
        return {"latents": attention.kv_a_proj_with_mqa}
    return {"keys": getattr(attention, "k_norm", attention.k_proj), "values": attention.v_proj}


def record_into(store: list):
    """Outputs as [tokens, width] (k_norm's output is per head: [batch, seq, heads, head_dim])."""
    return lambda _module, _inputs, output: store.append(
        output.reshape(output.shape[0] * output.shape[1], -1).float()
    )


@torch.no_grad()
def lstsq_params(model, stats: TeacherStats, ridge: float) -> dict[str, torch.Tensor]:
    """The SwiftKV parameters of `model` with each group owner's k/v_proj_swiftkv replaced by the
    ridge fit from s to the mean of its group's teacher K/V (the rest as they are; for a K norm, and
    for latent attention, see the module docstring)."""
    params = {name: p.detach().clone() for name, p in swiftkv_parameters(model).items()}
    s = model.model.norm_swiftkv(stats.h_n.to(model.dtype)).float()
    if stats.latents:
        return latent_params(model, stats, s, params, ridge)
    config = model.config
    for owner in config.kv_owners:
        members = range(owner, owner + config.key_value_group_size)
        prefix = f"model.layers.{owner}.self_attn"
        for name, targets in (("k", stats.keys), ("v", stats.values)):
            with_bias = f"{prefix}.{name}_proj_swiftkv.bias" in params
            target = torch.stack([targets[j] for j in members]).mean(0)
            norm_name = f"{prefix}.k_norm_swiftkv.weight"
            if name == "k" and norm_name in params:
                target = unit_rms_target(target, params[norm_name])
            weight, bias = ridge_fit(s, target, ridge, with_bias)
            params[f"{prefix}.{name}_proj_swiftkv.weight"] = weight
            if bias is not None:
                params[f"{prefix}.{name}_proj_swiftkv.bias"] = bias
    return params


def latent_params(model, stats: TeacherStats, s: torch.Tensor, params: dict, ridge: float) -> dict:
    """The mean init with each group owner's kv_a_proj_with_mqa_swiftkv fitted: its latent rows to
    `latent_target`, its k_rot rows to the group's mean k_rot before RoPE (module docstring)."""
    config = model.config
    params |= latent_init_tensors(config, model.state_dict(), average_group=True)
    rank = config.kv_lora_rank
    for owner in config.kv_owners:
        members = range(owner, owner + config.key_value_group_size)
        prefix = f"model.layers.{owner}.self_attn"
        norm_weights = [model.model.layers[j].self_attn.kv_a_layernorm.weight for j in members]
        target, row_weight = latent_target(
            [stats.latents[j][:, :rank] for j in members],
            norm_weights,
            params[f"{prefix}.kv_a_layernorm_swiftkv.weight"],
        )
        k_rot = torch.stack([stats.latents[j][:, rank:] for j in members]).mean(0)
        name = f"{prefix}.kv_a_proj_with_mqa_swiftkv"
        with_bias = f"{name}.bias" in params
        fits = [ridge_fit(s, target, ridge, with_bias, row_weight), ridge_fit(s, k_rot, ridge, with_bias)]
        params[f"{name}.weight"] = torch.cat([weight for weight, _ in fits])
        if with_bias:
            params[f"{name}.bias"] = torch.cat([bias for _, bias in fits])
    return params


def latent_target(
    compressed: list[torch.Tensor], norm_weights: list[torch.Tensor], student_norm_weight: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The latent rows' target [tokens, kv_lora_rank] and each token's weight [tokens, 1], from the pre-norm
    latents of a group's layers and their kv_a_layernorm weights: the direction of the group's mean
    post-norm latent divided by the student's norm weight, at the group's mean pre-norm RMS (module
    docstring). At G = 1 the target is the teacher's pre-norm latent exactly."""
    rms = [root_mean_square(c) for c in compressed]
    post_norm = torch.stack(
        [w.float() * c / r for c, w, r in zip(compressed, norm_weights, rms, strict=True)]
    ).mean(0)
    direction = unit_rms_target(post_norm, student_norm_weight)
    scale = torch.stack(rms).mean(0)
    return direction / root_mean_square(direction) * scale, 1 / scale


def root_mean_square(x: torch.Tensor) -> torch.Tensor:
    """Each row's RMS [rows, 1] (kept off zero: a zero row has no direction to fit)."""
    return x.pow(2).mean(-1, keepdim=True).sqrt().clamp_min(torch.finfo(x.dtype).tiny)


def unit_rms_target(post_norm: torch.Tensor, norm_weight: torch.Tensor) -> torch.Tensor:
    """The post-norm K [tokens, heads * head_dim] divided per head dimension by the student's K norm
    weight, i.e. what W s must be for k_norm_swiftkv(W s) to equal it. Weights near zero are kept
    away from it (a dimension the norm nearly erases carries no target worth fitting)."""
    weight = norm_weight.float()
    floor = 1e-3 * weight.abs().mean()
    safe = torch.where(weight.abs() < floor, floor * torch.where(weight < 0, -1.0, 1.0), weight)
    heads = post_norm.shape[-1] // len(safe)
    return post_norm / safe.repeat(heads)


def ridge_fit(x: torch.Tensor, y: torch.Tensor, ridge: float, with_bias: bool, row_weight=None):
    """argmin_W sum_t w_t^2 ||W x_t + b - y_t||^2 + lambda ||W||^2 in float64 (w_t = `row_weight`
    [rows, 1], 1 without it), lambda relative to the weighted x's scale."""
    x, y = x.double(), y.double()
    if with_bias:
        x = torch.cat([x, torch.ones(len(x), 1, dtype=x.dtype, device=x.device)], dim=1)
    if row_weight is not None:
        x, y = x * row_weight.double(), y * row_weight.double()
    gram = x.T @ x
    lam = ridge * gram.diagonal().mean()
    identity = torch.eye(len(gram), dtype=x.dtype, device=x.device)
    solution = torch.linalg.solve(gram + lam * identity, x.T @ y).T.float()
    return (solution[:, :-1], solution[:, -1]) if with_bias else (solution, None)


# --------------------------------------------------------------------------------------------------
# Measurement
# --------------------------------------------------------------------------------------------------


@torch.no_grad()
def kv_relative_error(model, stats: TeacherStats) -> dict[str, list[float]]:
    """Per later layer: ||K_student - K_teacher|| / ||K_teacher|| (and V), pre-RoPE (after the K norm
    where the family has one; latent attention: each head's decompressed K and V), held-out tokens."""
    config = model.config
    s = model.model.norm_swiftkv(stats.h_n.to(model.dtype))
    errors = {"k": [], "v": []}
    for j in config.later_layers:
        predicted = model.model.layers[config.kv_owner(j)].self_attn.swiftkv_key_value_heads(s)
        for name, got, expected in zip(
            ("k", "v"), predicted, teacher_key_value(model, stats, j), strict=True
        ):
            got = got.flatten(-2).float()
            errors[name].append(float((got - expected).norm() / expected.norm()))
    return errors


def teacher_key_value(model, stats: TeacherStats, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The teacher's K before RoPE and V of one later layer, [tokens, heads * head_dim] each: as recorded,
    or for latent attention decompressed from its recorded latent by the layer's own modules."""
    if not stats.latents:
        return stats.keys[layer], stats.values[layer]
    attention = model.model.layers[layer].self_attn
    key, value = attention.teacher_key_value_heads(stats.latents[layer].to(model.dtype))
    return key.flatten(-2).float(), value.flatten(-2).float()


# Bytes of fp32 logits the measurement projects at a time. The KL of a chunk holds about eight arrays of
# its size (both sides' logits, their fp32 copies, log-softmaxes, the product), so at a 128k vocabulary
# 256 rows would hold 1 GiB above the model; a chunk of this many bytes holds about 256 MiB.
LOGIT_CHUNK_BYTES = 32 * 2**20


@torch.no_grad()
def agreement(model, blocks: list[torch.Tensor]) -> tuple[float, float]:
    """Teacher-forced top-1 agreement and mean KL(teacher || student) per token, every position."""
    kl, same, count = 0.0, 0, 0
    chunk_rows = max(1, LOGIT_CHUNK_BYTES // (4 * model.config.vocab_size))
    for block in blocks:
        pair = model.model.forward_pair(block[None].to(model.device))
        block_kl, block_same, rows = agreement_stats(pair.student, pair.teacher, model.lm_head, chunk_rows)
        kl, same, count = kl + block_kl, same + block_same, count + rows
    return same / count, kl / count
