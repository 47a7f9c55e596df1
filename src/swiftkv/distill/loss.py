"""Distillation loss: T^2 * KL(teacher || student) on softmax(logits / T), plus optional cross-entropy
on the teacher's top-1 token and hidden MSE.

Inputs are the final hidden states (after the final norm) of the trained rows only, so the
vocabulary projection runs only where the loss is defined. Full-vocab logits never exist for the
whole batch: `backward_distill_loss` projects `chunk_rows` rows at a time, back-propagates each
chunk into a detached copy of the hidden states, then sends the accumulated gradient through the
model in one call. Peak memory is one chunk of logits, and no logits are recomputed.
"""

from __future__ import annotations

import torch

from ..metrics import LogitsFn, kl_sum, top1_cross_entropy_sum


def mse_sum(student_rows: torch.Tensor, teacher_rows: torch.Tensor) -> torch.Tensor:
    """Sum over rows of the mean squared difference of the hidden states (per-row mean over H)."""
    return (student_rows.float() - teacher_rows.float()).pow(2).mean(dim=-1).sum()


def distill_loss_sum(student_rows: torch.Tensor, teacher_rows: torch.Tensor, logits_fn: LogitsFn,
                     temperature: float, top1_weight: float = 0.0) -> torch.Tensor:
    """The logit terms summed over rows, unchunked (reference for tests; needs all logits at once):
    T^2 * KL, plus `top1_weight` x cross-entropy on the teacher's most likely token."""
    with torch.no_grad():
        teacher_logits = logits_fn(teacher_rows)
    student_logits = logits_fn(student_rows)
    loss = kl_sum(student_logits, teacher_logits, temperature)
    if top1_weight:
        loss = loss + top1_weight * top1_cross_entropy_sum(student_logits, teacher_logits)
    return loss


def backward_distill_loss(student_rows: torch.Tensor, teacher_rows: torch.Tensor, logits_fn: LogitsFn,
                          temperature: float, scale: float = 1.0, chunk_rows: int = 256,
                          also: torch.Tensor | None = None, top1_weight: float = 0.0) -> float:
    """Back-propagate `scale * distill_loss_sum(...)` chunk by chunk; return the unscaled sum.

    `student_rows` must carry the graph to the trained parameters; `teacher_rows` is a constant.
    `also` is another scalar loss term (already weighted and scaled, e.g. the hidden-state MSE) whose
    gradient joins the same single backward pass through the model.
    """
    leaf = student_rows.detach().requires_grad_(True)
    total = 0.0
    for start in range(0, leaf.shape[0], chunk_rows):
        rows = slice(start, start + chunk_rows)
        loss = distill_loss_sum(leaf[rows], teacher_rows[rows], logits_fn, temperature, top1_weight)
        (loss * scale).backward()
        total += float(loss.detach())
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
