"""Distillation loss: T^2 * KL(teacher || student) on softmax(logits / T), plus optional cross-entropy
on the teacher's top-1 token and hidden MSE, composed by `distill_loss` from the run's `LossTerms`.

Inputs are the final hidden states (after the final norm) of the trained rows only, so the
vocabulary projection runs only where the loss is defined. Full-vocab logits never exist for the
whole batch: `backward_logit_loss` projects `chunk_rows` rows at a time, back-propagates each
chunk into a detached copy of the hidden states, then sends the accumulated gradient through the
model in one call. Peak memory is one chunk of logits, and no logits are recomputed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...metrics import LogitsFn, kl_sum, top1_cross_entropy_sum
from ...model.modeling import PairHidden
from ...settings import setting

KL_MEAN_OVER = ("targets", "positions")


@dataclass(frozen=True)
class LossTerms:
    """What the loss adds up, the run's `loss` settings: the logit terms summed over the trained positions
    and divided by them (or by every position, as the reference does); the MSE term over every position."""

    temperature: float = setting(2.0, "softmax temperature of the T^2 * KL term")
    kl_mean_over: str = setting(
        "targets",
        "the KL sum is divided by the trained (assistant) positions, or by all "
        "positions as the reference does",
        choices=KL_MEAN_OVER,
    )
    top1_weight: float = setting(
        0.0,
        "weight of a cross-entropy term on the teacher's most likely token at each "
        "trained position (hard-label distillation; greedy agreement is decided at the "
        "argmax), divided like the KL",
    )
    mse_weight: float = setting(0.0, "weight of the hidden-state MSE term (all positions)")
    mse_hidden_index: int = setting(
        -2,
        "which transformers hidden_states entry the MSE compares (-2: the input of "
        "the last layer, as the reference); must be a later layer's input",
    )
    chunk_rows: int = setting(512, "positions per vocabulary chunk of the loss")


@dataclass(frozen=True)
class BatchSizes:
    """Denominators of the global batch's mean loss (the same on every process)."""

    targets: int  # trained positions (assistant tokens)
    positions: int  # every position

    @classmethod
    def of(cls, blocks) -> BatchSizes:
        return cls(int(blocks.loss_mask.sum()), blocks.loss_mask.numel())


def mse_sum(student_rows: torch.Tensor, teacher_rows: torch.Tensor) -> torch.Tensor:
    """Sum over rows of the mean squared difference of the hidden states (per-row mean over H)."""
    return (student_rows.float() - teacher_rows.float()).pow(2).mean(dim=-1).sum()


def logit_loss_sum(
    student_rows: torch.Tensor, teacher_rows: torch.Tensor, logits_fn: LogitsFn, terms: LossTerms
) -> torch.Tensor:
    """The logit terms summed over rows, unchunked (reference for tests; needs all logits at once):
    T^2 * KL, plus `top1_weight` x cross-entropy on the teacher's most likely token."""
    with torch.no_grad():
        teacher_logits = logits_fn(teacher_rows)
    student_logits = logits_fn(student_rows)
    loss = kl_sum(student_logits, teacher_logits, terms.temperature)
    if terms.top1_weight:
        loss = loss + terms.top1_weight * top1_cross_entropy_sum(student_logits, teacher_logits)
    return loss


def backward_logit_loss(
    student_rows: torch.Tensor,
    teacher_rows: torch.Tensor,
    logits_fn: LogitsFn,
    terms: LossTerms,
    scale: float = 1.0,
    also: torch.Tensor | None = None,
) -> torch.Tensor:
    """Back-propagate `scale * logit_loss_sum(...)` chunk by chunk; return the unscaled sum (a float64
    scalar tensor: reading each chunk's value on the host would wait for the device at every chunk).

    `student_rows` must carry the graph to the trained parameters; `teacher_rows` is a constant.
    `also` is another scalar loss term (already weighted and scaled, e.g. the hidden-state MSE) whose
    gradient joins the same single backward pass through the model.
    """
    leaf = student_rows.detach().requires_grad_(True)
    total = torch.zeros((), dtype=torch.float64, device=leaf.device)
    for start in range(0, leaf.shape[0], terms.chunk_rows):
        rows = slice(start, start + terms.chunk_rows)
        loss = logit_loss_sum(leaf[rows], teacher_rows[rows], logits_fn, terms)
        (loss * scale).backward()
        total += loss.detach().double()
    outputs, grads = [], []
    if leaf.grad is not None:
        outputs.append(student_rows)
        grads.append(leaf.grad.to(student_rows.dtype))
    if also is not None:
        outputs.append(also)
        grads.append(None)
    if outputs:
        torch.autograd.backward(outputs, grads)
    return total


def distill_loss(
    pair: PairHidden,
    logits_fn: LogitsFn,
    terms: LossTerms,
    sizes: BatchSizes,
    world_size: int,
    trained: bool = True,
) -> torch.Tensor:
    """Every term of one micro-batch, back-propagated, each scaled so that the gradients summed over a
    step's micro-batches and averaged over the processes are those of the global mean loss; returns this
    micro-batch's share of that mean, a float64 scalar on the device. `trained` False: the micro-batch has
    no trained position (a block of user text only; `pair` then holds one stand-in row), so the logit terms
    add nothing."""
    divisor = max(1, sizes.targets if terms.kl_mean_over == "targets" else sizes.positions)
    share, mse_term = torch.zeros((), dtype=torch.float64, device=pair.student.device), None
    if pair.student_probe is not None:
        mse = mse_sum(pair.student_probe, pair.teacher_probe) / max(1, sizes.positions)
        mse_term = terms.mse_weight * mse * world_size
        share += mse_term.detach().double() / world_size
    scale = world_size / divisor if trained else 0.0
    logit_sum = backward_logit_loss(pair.student, pair.teacher, logits_fn, terms, scale, also=mse_term)
    return (share + logit_sum / divisor) if trained else share
