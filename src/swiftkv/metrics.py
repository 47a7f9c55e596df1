"""How close a student is to its teacher, and what a token costs: the one definition of KL, top-1
agreement and the FLOPs model, used by convert (calibration report), distill (loss and held-out
numbers), eval (chat agreement, trade-off sweep) and bench (compute bound)."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from .model.config import head_dim_of, is_swiftkv

LogitsFn = Callable[[torch.Tensor], torch.Tensor]  # final hidden rows [M, H] -> logits [M, V] (lm_head)

# --------------------------------------------------------------------------------------------------
# Agreement
# --------------------------------------------------------------------------------------------------


def kl_per_row(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """KL(softmax(teacher / T) || softmax(student / T)) of each row, in fp32."""
    student_logp = F.log_softmax(student_logits.float() / temperature, dim=-1)
    teacher_logp = F.log_softmax(teacher_logits.float() / temperature, dim=-1)
    return (teacher_logp.exp() * (teacher_logp - student_logp)).sum(-1)


def kl_sum(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Sum over rows of T^2 * KL(teacher || student) at temperature T (the distillation loss term)."""
    return kl_per_row(student_logits, teacher_logits, temperature).sum() * temperature**2


def top1_cross_entropy_sum(student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
    """Sum over rows of -log p_student(the teacher's most likely token): hard-label distillation.
    Greedy agreement is decided at the argmax alone, which a KL spread over the whole distribution
    (at T = 2 especially) weighs no more than any other mass."""
    return F.cross_entropy(student_logits.float(), teacher_logits.argmax(-1), reduction="sum")


def top1_matches(student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> int:
    """Rows whose most likely next token is the same for both."""
    return int((student_logits.argmax(-1) == teacher_logits.argmax(-1)).sum())


@torch.no_grad()
def agreement_stats(
    student_rows: torch.Tensor, teacher_rows: torch.Tensor, logits_fn: LogitsFn, chunk_rows: int = 256
) -> tuple[float, int, int]:
    """(sum of KL(teacher || student) at T = 1, rows whose top-1 tokens agree, rows), projecting
    `chunk_rows` rows to the vocabulary at a time (full-vocab logits of a batch never exist at once)."""
    kl, agree = 0.0, 0
    for start in range(0, student_rows.shape[0], chunk_rows):
        rows = slice(start, start + chunk_rows)
        student_logits, teacher_logits = logits_fn(student_rows[rows]), logits_fn(teacher_rows[rows])
        kl += float(kl_per_row(student_logits, teacher_logits).sum())
        agree += top1_matches(student_logits, teacher_logits)
    return kl, agree, student_rows.shape[0]


# --------------------------------------------------------------------------------------------------
# FLOPs
# --------------------------------------------------------------------------------------------------


def layer_linear_flops(config) -> dict[str, int]:
    """Multiply-accumulates x 2 per token of one decoder layer's projections."""
    head_dim = head_dim_of(config)
    q, kv = config.num_attention_heads * head_dim, config.num_key_value_heads * head_dim
    hidden = config.hidden_size
    return {
        "q": 2 * hidden * q,
        "kv": 2 * 2 * hidden * kv,
        "o": 2 * q * hidden,
        "mlp": 2 * 3 * hidden * config.intermediate_size,
    }


def attention_flops(config, keys: float) -> float:
    """QK^T and AV FLOPs of one query token over `keys` keys, one layer."""
    return 2 * 2 * config.num_attention_heads * head_dim_of(config) * keys


def prefill_flops_per_token(config, prompt_len: int) -> float:
    """Baseline (all layers) prefill FLOPs per prompt token: every layer's projections plus causal
    attention over (prompt_len + 1) / 2 keys on average. The lm_head is excluded: a prefill with
    max_tokens=1 applies it to one row per prompt."""
    per_layer = sum(layer_linear_flops(config).values()) + attention_flops(config, (prompt_len + 1) / 2)
    return config.num_hidden_layers * per_layer


def prefill_compute_saving(config) -> float | None:
    """Fraction of a prompt token's linear-layer FLOPs a SwiftKV student skips: layers >= N run only
    their group owners' k/v_proj_swiftkv. Attention-score FLOPs (length dependent) are not counted."""
    if not is_swiftkv(config):
        return None
    n = config.num_key_value_layers
    flops = layer_linear_flops(config)
    layers, per_layer = config.num_hidden_layers, sum(flops.values())
    student = n * per_layer + (layers - n) // config.key_value_group_size * flops["kv"]
    return 1 - student / (layers * per_layer)


def distill_flops_per_token(
    config, seq_len: int, target_fraction: float, late_weights: bool = False
) -> float:
    """FLOPs per train token of one shared-prefix distillation step, the numerator of its compute
    bound. Layers < N run forward once for both models; the teacher's later layers forward; the
    student's later layers forward (q/o/MLP, attention, and each group's K/V from s) and backward:
    activation gradients cost one more forward (attention two), weight gradients only for the
    trained SwiftKV projections (and the later layers' o_proj and MLP with `late_weights`, the
    student-only copies of `--trainable late`); the lm_head runs on the trained rows (`target_fraction`
    of the tokens) forward for the teacher, forward and backward (activations) for the student."""
    flops = layer_linear_flops(config)
    n, later, groups = (
        config.num_key_value_layers,
        config.num_hidden_layers - config.num_key_value_layers,
        config.num_kv_groups,
    )
    attention = attention_flops(config, (seq_len + 1) / 2)
    full_layer = sum(flops.values()) + attention
    student_linear = later * (flops["q"] + flops["o"] + flops["mlp"]) + groups * flops["kv"]
    student = (
        2 * student_linear
        + 3 * later * attention  # forward + activation gradients
        + later * flops["q"]
        + groups * flops["kv"]
    )  # weight gradients of the SwiftKV projections
    if late_weights:
        student += later * (flops["o"] + flops["mlp"])
    head = 2 * config.hidden_size * config.vocab_size * target_fraction
    return n * full_layer + later * full_layer + student + 3 * head


def matmul_peak(
    dtype: torch.dtype, size: int | None = None, repeats: int = 10, device: str | torch.device = "cpu"
) -> float:
    """Best observed matmul rate (FLOP/s) in `dtype` on `device` (the CPU with torch's own threads, or
    a GPU, whose peak needs bigger matrices to show)."""
    device = torch.device(device)
    size = size or (8192 if device.type == "cuda" else 2048)
    a = torch.randn(size, size, device=device).to(dtype)
    b = torch.randn(size, size, device=device).to(dtype)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    a @ b  # warm-up
    sync()
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        a @ b
        sync()
        best = min(best, time.perf_counter() - started)
    return 2 * size**3 / best
