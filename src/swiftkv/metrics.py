"""How close a student is to its teacher: the one definition of KL and top-1 agreement, used by convert
(calibration report), distill (loss and held-out numbers) and eval (chat agreement)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

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
