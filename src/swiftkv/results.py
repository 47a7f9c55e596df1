"""The schemas of the results swiftkv writes, one definition each: the JSON files (`results.json` of
`swiftkv eval`, `bench.json` / `online.json` of `swiftkv bench`, `distill.json` of `swiftkv distill`)
are these dicts as they are. Producers return them and readers (the reports, plots, sweep and the
study's cards) are annotated with them, so a key's name and meaning live here, not in each reader.
`total=False` marks what a run may leave out (a measure that was not asked for)."""

from __future__ import annotations

from typing import TypedDict

# --------------------------------------------------------------------------------------------------
# swiftkv eval
# --------------------------------------------------------------------------------------------------


class Paired(TypedDict):
    """One metric of one task, student against teacher on the same items (`evaluate.stats`)."""

    n: int
    teacher: float
    student: float
    diff: float  # student - teacher
    diff_stderr: float  # paired standard error of `diff`
    agreement: float  # same answer picked, right or wrong
    teacher_only_correct: int
    student_only_correct: int
    mcnemar_p: float


class TaskResult(TypedDict):
    items: int
    limit: int | None
    metrics: dict[str, dict[str, float]]  # role (teacher/student) -> lm-eval metric -> value (acc, acc_stderr, ...)
    paired: dict[str, Paired]  # metric -> paired comparison
    item_ids: list[str]
    answers: dict[str, list[int]]  # role -> answer picked per item, in item_ids order


class PairInfo(TypedDict, total=False):
    student: str
    teacher: str
    mode: str  # shared (one model, layers < N once) or separate
    dtype: str
    cache_keys: dict[str, str]
    num_hidden_layers: int  # the three below: SwiftKV students only
    num_key_value_layers: int
    key_value_group_size: int


class TeacherForced(TypedDict, total=False):
    """Held-out chat, teacher-forced on the assistant tokens."""

    conversations: int
    tokens: int
    kl_mean: float  # KL(teacher || student) per token
    top1_agreement: float
    nll_teacher: float
    nll_student: float


class Generation(TypedDict):
    """Greedy answers to held-out prompts, student against teacher."""

    prompts: int
    new_tokens: int
    identical_fraction: float  # answers whose first `new_tokens` tokens equal the teacher's
    mean_first_divergence: float
    examples: list[dict[str, str | int]]  # prompt, teacher, student, first_divergence


class LongPrompt(TypedDict):
    prompts: int
    new_tokens: int
    prompt_tokens_mean: float
    kl_mean: float  # along the teacher's answer
    top1_agreement: float
    identical_fraction: float
    mean_first_divergence: float


class Agreement(TypedDict, total=False):
    teacher_forced: TeacherForced
    generation: Generation
    long_prompt: LongPrompt


class StudentResult(Agreement, total=False):
    pair: PairInfo
    tasks: dict[str, TaskResult]
    prefill_compute_saving: float | None  # fraction of a prompt token's linear FLOPs skipped
    seconds: float


class FloorResult(Agreement, total=False):
    pair: PairInfo
    seconds: float


class EvalResults(TypedDict):
    """`results.json` of `swiftkv eval`."""

    teacher: str
    dtype: str
    tasks: list[str]
    limits: dict[str, int]
    settings: dict[str, int | float | str]
    students: list[StudentResult]
    floor: FloorResult | None
    wall_time_s: float


# --------------------------------------------------------------------------------------------------
# swiftkv bench
# --------------------------------------------------------------------------------------------------


class BenchResults(TypedDict):
    """`bench.json` of `swiftkv bench` (offline): per model, the measured workloads by metric key
    (`bench.offline.METRICS`: prefill_tok_s, ttft_s, tpot_s, e2e_req_s, kv_cache_tokens, ...)."""

    model: str
    baseline_model: str
    settings: dict[str, int | str | bool]  # the engine options both models ran with
    workloads: dict[str, int]
    measured: list[str]
    peak_flops: float
    flops_per_token: float
    date: str
    baseline: dict[str, float]
    swiftkv: dict[str, float]
    ratio: dict[str, float | None]  # swiftkv / baseline; None where the baseline's value is 0


class OnlineResults(TypedDict, total=False):
    """`online.json` of `swiftkv bench --online`: per model, one row per request rate."""

    model: str
    baseline_model: str
    date: str
    workload: dict[str, int | float | str]
    rates: list[float]
    slo: dict[str, float]  # ttft_s, tpot_s
    idle: dict[str, dict[str, float]]
    sessions: list[dict]
    results: dict[str, list[dict[str, float] | None]]  # model -> per rate: ttft_p99_s, tpot_p50_s, ...
    summary: dict


# --------------------------------------------------------------------------------------------------
# swiftkv distill
# --------------------------------------------------------------------------------------------------


class HeldOut(TypedDict, total=False):
    step: int
    kl: float
    top1: float
    positions: int


class DistillSummary(TypedDict):
    """`distill.json` in the distilled folder, and what `swiftkv distill` prints."""

    settings: dict  # DistillSettings as a dict
    steps: int
    micro_batch: int  # blocks per forward as run (--micro-batch auto resolved)
    train_tokens: int
    train_seconds: float
    tokens_per_second: float | None
    heldout_before: HeldOut | None
    heldout_after: HeldOut | None
    final_loss: float | None
    history: list[dict]  # held-out evaluations and per-step losses, in step order
