"""Paired comparison of two models scored on the same items.

Both models answer the same questions, so their accuracies are strongly correlated; the standard
error of the difference must come from the per-item differences (paired), not from the two
independent standard errors. The test is McNemar's exact test: under "no difference", the items
that exactly one model gets right are equally likely to favour either.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def mcnemar_exact_p(teacher_only: int, student_only: int) -> float:
    """Two-sided exact McNemar p-value: P(|Binomial(b + c, 1/2) - (b+c)/2| >= observed)."""
    n = teacher_only + student_only
    if n == 0:
        return 1.0
    k = min(teacher_only, student_only)
    tail = sum(math.comb(n, i) for i in range(k + 1))  # exact integers: no overflow at any n
    return min(1.0, 2 * tail / 2**n)


def paired_mean(diffs: Sequence[float]) -> tuple[float, float]:
    """The mean of paired differences and its standard error (sample variance / n; 0 for one pair)."""
    n = len(diffs)
    mean = sum(diffs) / n
    variance = sum((d - mean) ** 2 for d in diffs) / (n - 1) if n > 1 else 0.0
    return mean, math.sqrt(variance / n)


def same_per_item(a: Sequence, b: Sequence) -> list[int]:
    """1 for each item on which two models' records (answers picked, verdicts, tokens) are the same, else 0."""
    return [int(x == y) for x, y in zip(a, b, strict=True)]


def paired_difference(
    before: Sequence[float], after: Sequence[float], items: str = "items", models: str = "models"
) -> tuple[float, float, int, int]:
    """after - before, pair by pair: the mean difference, its paired standard error, and the pairs where
    before is the greater and where after is (for 0/1 hits: the items only one of them hits). `items` and
    `models` name the pairs and their two sides in the error for unpaired input (none, or unequal counts)."""
    if not before or len(before) != len(after):
        raise ValueError(f"expected the same {items} for both {models}; got {len(before)} and {len(after)}")
    diffs = [a - b for b, a in zip(before, after, strict=True)]
    mean_diff, stderr = paired_mean(diffs)
    return mean_diff, stderr, sum(d < 0 for d in diffs), sum(d > 0 for d in diffs)


def paired_hits(before: Sequence[float], after: Sequence[float]) -> dict:
    """Two models' per-item hits (1 where an item counts for the model) on the same items: after's rate minus
    before's with its paired standard error, the items only one of them hits, and McNemar's test on those
    ("teacher" is `before`, "student" is `after`)."""
    mean_diff, stderr, before_only, after_only = paired_difference(before, after)
    n = len(before)
    return {
        "n": n,
        "teacher": sum(before) / n,
        "student": sum(after) / n,
        "diff": mean_diff,
        "diff_stderr": stderr,
        "teacher_only_correct": before_only,
        "student_only_correct": after_only,
        "mcnemar_p": mcnemar_exact_p(before_only, after_only),
    }


def paired_comparison(
    teacher_correct: Sequence[float],
    student_correct: Sequence[float],
    teacher_pred: Sequence[int],
    student_pred: Sequence[int],
) -> dict:
    """Accuracy difference (student - teacher) with its paired standard error, the agreement (same
    answer picked, right or wrong) and McNemar's test on the discordant items."""
    n = len(teacher_correct)
    if not n == len(student_correct) == len(teacher_pred) == len(student_pred):
        raise ValueError("paired_comparison needs the same items for both models")
    return {  # paired_hits refuses no items, before the agreement divides by n
        **paired_hits(teacher_correct, student_correct),
        "agreement": sum(same_per_item(teacher_pred, student_pred)) / n,
    }


def check_same_items(before, after) -> None:
    """Two eval runs (results.json task or long-QA entries, read by attribute) can be paired: the same items,
    each run with its per-item correctness."""
    if before.item_ids != after.item_ids:
        raise ValueError("the two runs scored different items; expected runs with the same --limit")
    if before.correct is None or after.correct is None:
        raise ValueError(
            "a run without per-item correctness (`correct`, results.json from before 2026-11-27); "
            "expected two runs of today's `swiftkv eval`"
        )


def paired_runs(before, after) -> dict:
    """The students of two eval runs on the same items (each a results.json task entry, read by attribute:
    `item_ids`, `answers`, `correct`): after's accuracy minus before's, paired, with McNemar's test on the
    items only one of them got right ("teacher" is `before`, "student" is `after`)."""
    check_same_items(before, after)
    return paired_comparison(
        before.correct["student"],
        after.correct["student"],
        before.answers["student"],
        after.answers["student"],
    )


def paired_divergences(before: Sequence[int], after: Sequence[int]) -> dict:
    """Two students' first greedy divergences from the teacher on the same prompts (tokens into the answer):
    after's mean minus before's with its paired standard error, the prompts on which each one keeps to the
    teacher longer, and the sign test on those (the same exact binomial as McNemar's; ties drop out)."""
    mean_diff, stderr, before_longer, after_longer = paired_difference(before, after, "prompts", "students")
    n = len(before)
    return {
        "n": n,
        "before": sum(before) / n,
        "after": sum(after) / n,
        "diff": mean_diff,
        "diff_stderr": stderr,
        "before_longer": before_longer,
        "after_longer": after_longer,
        "sign_p": mcnemar_exact_p(before_longer, after_longer),
    }
