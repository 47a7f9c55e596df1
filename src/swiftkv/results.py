"""The schemas of the results swiftkv writes, one definition each: `results.json` of `swiftkv eval`
(EvalResults), `bench.json` / `online.json` / `profile.json` / `decode-steps.json` / `bench-moe.json` of `swiftkv bench`
(BenchResults, OnlineResults, ProfileResults, DecodeStepsResults, MoePrefillResults) and
`distill.json` of `swiftkv distill` (DistillSummary).

Each is a small frozen dataclass read by attribute (`results.students[0].teacher_forced.kl_mean`), so a
key's name and meaning live here, not in each reader. Producers build the JSON dicts; readers (the
reports, plots, sweep and the study's cards) go through `X.from_json(dict)` (or `X.of(dict_or_X)`).
`to_json()` gives the dict back as it was read: the same keys in the same order, a key the schema does
not name (an older or newer file) kept as it was, so the files stay byte-identical through a round trip.

A field a file leaves out reads as None (a measure that was not asked for, an older file); a record
read from an empty dict is falsy, as the dict was. Maps keyed by data (task names, lm-eval metric
names, roles, model names) stay dicts of records.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, ClassVar, TypeVar, Union

R = TypeVar("R", bound="Record")


@dataclasses.dataclass(frozen=True)
class Record:
    """Base of the result records: `from_json` / `to_json` round-trip a JSON object exactly."""

    # The keys of the dict this record was read from, in order (None: built in code, every field is
    # written in definition order), and the keys the schema does not name, with their values.
    _keys: tuple[str, ...] | None = dataclasses.field(default=None, repr=False, compare=False, kw_only=True)
    _extra: dict[str, Any] = dataclasses.field(default_factory=dict, repr=False, compare=False, kw_only=True)
    _hints: ClassVar[dict[type, dict[str, Any]]] = {}

    @classmethod
    def schema(cls) -> dict[str, Any]:
        """Field name -> type, for the fields of the JSON object (the bookkeeping fields left out)."""
        if cls not in Record._hints:
            hints = typing.get_type_hints(cls)
            Record._hints[cls] = {
                f.name: hints[f.name] for f in dataclasses.fields(cls) if not f.name.startswith("_")
            }
        return Record._hints[cls]

    @classmethod
    def from_json(cls: type[R], data: dict[str, Any]) -> R:
        schema = cls.schema()
        values = {key: decode(schema[key], value) for key, value in data.items() if key in schema}
        extra = {key: value for key, value in data.items() if key not in schema}
        return cls(**values, _keys=tuple(data), _extra=extra)

    @classmethod
    def of(cls: type[R], data: R | dict[str, Any]) -> R:
        """`data` as this record: read from its JSON dict, or as it is when it already is one."""
        return data if isinstance(data, cls) else cls.from_json(data)

    def to_json(self) -> dict[str, Any]:
        keys = self._keys if self._keys is not None else tuple(self.schema())
        return {key: self._extra[key] if key in self._extra else encode(getattr(self, key)) for key in keys}

    def __bool__(self) -> bool:
        return self._keys is None or bool(self._keys)


def decode(kind: Any, value: Any) -> Any:
    """A JSON value as `kind`: records for the record types in it, the value itself otherwise."""
    if value is None:
        return None
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if isinstance(kind, type) and issubclass(kind, Record):
        return kind.from_json(value) if isinstance(value, dict) else value
    if origin in (Union, types.UnionType):
        structured = [arg for arg in args if arg is not type(None)]
        return decode(structured[0], value) if len(structured) == 1 else value
    if origin is list and args and isinstance(value, list):
        return [decode(args[0], item) for item in value]
    if origin is dict and len(args) == 2 and isinstance(value, dict):
        return {key: decode(args[1], item) for key, item in value.items()}
    return value


def encode(value: Any) -> Any:
    if isinstance(value, Record):
        return value.to_json()
    if isinstance(value, list):
        return [encode(item) for item in value]
    if isinstance(value, dict):
        return {key: encode(item) for key, item in value.items()}
    return value


record = dataclasses.dataclass(frozen=True)

# --------------------------------------------------------------------------------------------------
# swiftkv eval
# --------------------------------------------------------------------------------------------------


@record
class Paired(Record):
    """One metric of one task, student against teacher on the same items (`evaluate.stats`)."""

    n: int | None = None
    teacher: float | None = None
    student: float | None = None
    diff: float | None = None  # student - teacher
    diff_stderr: float | None = None  # paired standard error of `diff`
    agreement: float | None = None  # same answer picked, right or wrong
    teacher_only_correct: int | None = None
    student_only_correct: int | None = None
    mcnemar_p: float | None = None


@record
class TaskResult(Record):
    items: int | None = None
    limit: int | None = None
    metrics: dict[str, dict[str, float]] | None = (
        None  # role (teacher/student) -> lm-eval metric -> value (acc, acc_stderr, ...)
    )
    paired: dict[str, Paired] | None = None  # metric -> paired comparison
    item_ids: list[str] | None = None
    answers: dict[str, list[int]] | None = None  # role -> answer picked per item, in item_ids order
    correct: dict[str, list[int]] | None = None  # role -> 1 where that answer was right (acc), same order


@record
class PairInfo(Record):
    student: str | None = None
    teacher: str | None = None
    mode: str | None = None  # shared (one model, layers < N once) or separate
    dtype: str | None = None
    cache_keys: dict[str, str] | None = None
    num_hidden_layers: int | None = None  # the three below: SwiftKV students only
    num_key_value_layers: int | None = None
    key_value_group_size: int | None = None


@record
class TeacherForced(Record):
    """Held-out chat, teacher-forced on the assistant tokens."""

    conversations: int | None = None
    tokens: int | None = None
    kl_mean: float | None = None  # KL(teacher || student) per token
    top1_agreement: float | None = None
    nll_teacher: float | None = None
    nll_student: float | None = None


@record
class Example(Record):
    """One held-out prompt answered greedily by both models."""

    prompt: str | None = None
    teacher: str | None = None
    student: str | None = None
    first_divergence: int | None = None  # index of the first generated token that differs


@record
class Generation(Record):
    """Greedy answers to held-out prompts, student against teacher."""

    prompts: int | None = None
    new_tokens: int | None = None
    identical_fraction: float | None = None  # answers whose first `new_tokens` tokens equal the teacher's
    mean_first_divergence: float | None = None
    first_divergences: list[int] | None = None  # each prompt's, in prompt order (pairs two students)
    examples: list[Example] | None = None


@record
class LongPrompt(Record):
    prompts: int | None = None
    new_tokens: int | None = None
    prompt_tokens_mean: float | None = None
    kl_mean: float | None = None  # along the teacher's answer
    top1_agreement: float | None = None
    identical_fraction: float | None = None
    mean_first_divergence: float | None = None
    first_divergences: list[int] | None = None  # each prompt's, in prompt order


@record
class LongQA(Record):
    """One long-prompt QA set (`evaluate.long_qa`), student against teacher, with its per-item records."""

    items: int | None = None
    new_tokens: int | None = None
    prompt_tokens_mean: float | None = None
    match: str | None = None  # how `correct` is decided
    paired: dict[str, Paired] | None = (
        None  # correct / exact_match -> paired comparison (agreement: same verdict)
    )
    agreement_stderr: float | None = None  # of paired["correct"].agreement
    both_right: int | None = None
    both_wrong: int | None = None
    identical_fraction: float | None = None  # answers of the same tokens
    identical_stderr: float | None = None
    item_ids: list[str] | None = None
    answers: dict[str, list[str]] | None = None  # role -> decoded answer per item, in item_ids order
    correct: dict[str, list[int]] | None = None  # role -> 1 where the answer holds a gold answer
    exact_match: dict[str, list[int]] | None = None  # role -> 1 where the answer is a gold answer
    f1: dict[str, list[float]] | None = None  # role -> SQuAD F1 against the best gold
    identical: list[int] | None = None  # 1 where the two answers are the same tokens


@record
class InstructionFollowing(Record):
    """One instruction set (`evaluate.instructions`), student against teacher, with its per-item records."""

    name: str | None = None
    items: int | None = None  # prompts
    instructions: int | None = None  # instructions over all prompts
    left_out: int | None = None  # prompts whose checkers need NLTK data no pip package carries
    new_tokens: int | None = None
    prompt_tokens_mean: float | None = None
    paired: dict[str, Paired] | None = None  # prompt_strict / prompt_loose / instruction_strict / ..._loose
    item_ids: list[str] | None = None
    replies: dict[str, list[str]] | None = None  # role -> decoded reply per prompt
    scores: dict[str, dict[str, list[int]]] | None = None  # role -> measure -> per-item (instruction) hits


@record
class FloorResult(Record):
    """The teacher against itself at another dtype: the most agreement a student can be asked for."""

    pair: PairInfo | None = None
    teacher_forced: TeacherForced | None = None
    generation: Generation | None = None
    long_prompt: LongPrompt | None = None
    long_qa: dict[str, LongQA] | None = None  # set name -> its scores
    instruction_following: InstructionFollowing | None = None
    seconds: float | None = None


@record
class StudentResult(Record):
    pair: PairInfo | None = None
    tasks: dict[str, TaskResult] | None = None
    teacher_forced: TeacherForced | None = None
    generation: Generation | None = None
    long_prompt: LongPrompt | None = None
    long_qa: dict[str, LongQA] | None = None  # set name -> its scores
    instruction_following: InstructionFollowing | None = None
    prefill_compute_saving: float | None = None  # fraction of a prompt token's linear FLOPs skipped
    seconds: float | None = None


@record
class EvalResults(Record):
    """`results.json` of `swiftkv eval`."""

    teacher: str | None = None
    dtype: str | None = None
    tasks: list[str] | None = None
    limits: dict[str, int] | None = None
    settings: dict[str, Any] | None = None
    engines: dict[str, str] | None = None  # measure -> what computed it (library, device, how)
    students: list[StudentResult] | None = None
    floor: FloorResult | None = None
    recipe: dict[str, Any] | None = None  # --tasks snowflake: its tasks, engine and each model's metrics
    wall_time_s: float | None = None


# --------------------------------------------------------------------------------------------------
# swiftkv bench
# --------------------------------------------------------------------------------------------------


@record
class BenchResults(Record):
    """`bench.json` of `swiftkv bench` (offline): per model, the measured workloads by metric key
    (`bench.offline.METRICS`: prefill_tok_s, ttft_s, tpot_s, e2e_req_s, kv_cache_tokens, ...)."""

    model: str | None = None
    baseline_model: str | None = None
    settings: dict[str, Any] | None = None  # the engine options both models ran with
    workloads: dict[str, int] | None = None
    measured: list[str] | None = None
    peak_flops: float | None = None
    flops_per_token: float | None = None
    date: str | None = None
    baseline: dict[str, float] | None = None
    swiftkv: dict[str, float] | None = None
    ratio: dict[str, float | None] | None = None  # swiftkv / baseline; None where the baseline's value is 0


@record
class MoeEngineResult(Record):
    """One model of `swiftkv bench --moe` (`bench.moe.engine_result`)."""

    engine_startup_s: float | None = None
    kv_cache_tokens: int | None = None
    architecture: str | None = None
    fast_prefill: bool | None = (
        None  # vLLM's kv_sharing_fast_prefill: the later layers skip the prompt tokens
    )
    peak_rss_mib: float | None = None  # the engine process's peak resident memory over the run
    prefill_tok_s_runs: list[float] | None = None  # each timed prefill batch, in run order
    prefill_tok_s: float | None = None  # their median
    flops_per_token: float | None = (
        None  # its own prefill FLOPs per prompt token (`flops.prefill_flops_per_token`)
    )
    prefill_utilization: float | None = None  # prefill_tok_s x flops_per_token / peak_flops


@record
class MoePrefillResults(Record):
    """`bench-moe.json` of `swiftkv bench --moe`: the teacher and its SwiftKV student at N = L / 2 on a random
    Mixture-of-Experts shape, and the prefill ratio against its FLOP bound."""

    shape: dict[str, int | bool] | None = None  # `bench.moe.MoeShape`: layers, experts, widths, the workload
    num_key_value_layers: int | None = None
    weight_bytes: int | None = None  # the teacher's weights in the engines' dtype
    settings: dict[str, Any] | None = None  # the engine options both models ran with
    peak_flops: float | None = None  # matmul peak measured in the run, in the engines' dtype
    date: str | None = None
    baseline: MoeEngineResult | None = None
    swiftkv: MoeEngineResult | None = None
    prefill_ratio: float | None = None  # SwiftKV / baseline median prefill tok/s
    flop_bound: float | None = None  # the baseline's prefill FLOPs per token / the student's
    fraction_of_bound: float | None = None  # prefill_ratio / flop_bound


@record
class RateResult(Record):
    """One model at one request rate of the online benchmark (`bench.online_metrics.rate_row`, from
    vLLM's benchmark result)."""

    rate: float | None = None
    completed: int | None = None
    failed: int | None = None
    duration_s: float | None = None
    request_throughput: float | None = None
    output_throughput: float | None = None
    total_token_throughput: float | None = None
    goodput: float | None = None  # requests per second that met the SLO
    ttft_mean_s: float | None = None
    ttft_p50_s: float | None = None
    ttft_p99_s: float | None = None
    tpot_mean_s: float | None = None
    tpot_p50_s: float | None = None
    tpot_p99_s: float | None = None
    itl_mean_s: float | None = None
    itl_p50_s: float | None = None
    itl_p99_s: float | None = None
    latency_mean_s: float | None = None
    latency_p50_s: float | None = None
    latency_p99_s: float | None = None
    meets_slo: bool | None = None
    errors: list | dict | None = None
    speculative: dict | None = None  # the speculator's drafts and acceptance over the rate (None: none)


@record
class IdleLatency(Record):
    """One model answering a few requests alone: the latencies the SLO is scaled from."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    latency_s: float | None = None
    requests: int | None = None


@record
class SLOInfo(Record):
    ttft_s: float | None = None
    tpot_s: float | None = None
    how: str | None = None


@record
class OnlineWorkload(Record):
    kind: str | None = None  # sharegpt or extractive (None: written before there was a choice, sharegpt)
    prompt_len: int | None = None
    output_len: int | None = None
    num_requests: int | None = None
    arrivals: str | None = None
    ignore_eos: bool | None = None
    prompt_source: str | None = None


@record
class OnlineSummary(Record):
    """SwiftKV against the baseline across the rates (`bench.online_metrics.compare`)."""

    max_rate: dict[str, float | None] | None = None  # model -> highest rate within the SLO
    max_rate_is_lower_bound: dict[str, bool] | None = None  # model -> it was the highest rate tested
    max_rate_ratio: float | None = None
    baseline_saturation_rate: float | None = None
    tpot_p50_ratio_at_saturation: float | None = None
    per_rate: list[dict] | None = None


@record
class OnlineResults(Record):
    """`online.json` of `swiftkv bench --online`: per model, one row per request rate."""

    model: str | None = None
    baseline_model: str | None = None
    date: str | None = None
    workload: OnlineWorkload | None = None
    speculative_config: dict[str, dict | None] | None = None  # model -> its server's speculative config
    rates: list[float] | None = None
    slo: SLOInfo | None = None
    idle: dict[str, IdleLatency] | None = None
    sessions: list[dict] | None = None
    results: dict[str, list[RateResult | None]] | None = None  # model -> per rate (None: not run)
    summary: OnlineSummary | None = None


@record
class TopOp(Record):
    """One operator of a profiled step, by self time (`bench.profile.region_times`)."""

    op: str | None = None
    self_s: float | None = None
    calls: int | None = None


@record
class ModelProfile(Record):
    """One model's mixed prefill/decode step: timed (medians) and under torch's profiler."""

    mixed_step_s: float | None = None
    decode_step_s: float | None = None
    prompt_in_one_step: bool | None = None
    profiled_step_s: float | None = None
    regions: dict[str, float] | None = None  # record_function range -> inclusive CPU seconds
    top_ops: list[TopOp] | None = None


@record
class ProfileResults(Record):
    """`profile.json` of `swiftkv bench --profile`."""

    model: str | None = None
    baseline_model: str | None = None
    settings: dict[str, Any] | None = None  # the engine options both models ran with
    scenario: dict[str, int] | None = None  # bench.profile.Scenario's fields
    date: str | None = None
    baseline: ModelProfile | None = None
    swiftkv: ModelProfile | None = None


@record
class ModelDecodeSteps(Record):
    """One model's timed decode-only steps (`bench.profile.time_decode_steps`)."""

    step_s: list[float] | None = None
    median_step_s: float | None = None
    mean_step_s: float | None = None
    every_step_decoded_the_whole_batch: bool | None = None


@record
class DecodeStepsResults(Record):
    """`decode-steps.json` of `swiftkv bench --decode-steps`."""

    model: str | None = None
    baseline_model: str | None = None
    settings: dict[str, Any] | None = None
    scenario: dict[str, int] | None = None  # bench.profile.DecodeScenario's fields
    date: str | None = None
    baseline: ModelDecodeSteps | None = None
    swiftkv: ModelDecodeSteps | None = None
    median_step_ratio: float | None = None  # swiftkv / baseline


# --------------------------------------------------------------------------------------------------
# swiftkv distill
# --------------------------------------------------------------------------------------------------


@record
class HeldOut(Record):
    step: int | None = None
    kl: float | None = None
    top1: float | None = None
    positions: int | None = None


@record
class ComputeBound(Record):
    """A distillation step's FLOPs per train token as executed (on the run's own blocks) over the matmul peak
    of its devices in the compute dtype, and over their nominal peak (`distill.bound`)."""

    flops_per_token: int | None = None
    matmul_peak_flops: int | None = None
    bound_tokens_per_s: float | None = None  # a perfectly matmul-bound step's rate
    fraction_of_bound: float | None = None  # the run's tokens/s against it (None: no step taken)
    # since 2026-12-01 (FLOPs counted as executed): the devices' name, their nominal dense bf16 peak and the
    # run's MFU against it (None on a CPU or an unlisted GPU)
    device: str | None = None
    nominal_peak_flops: int | None = None
    mfu: float | None = None


@record
class DistillSummary(Record):
    """`distill.json` in the distilled folder, and what `swiftkv distill` prints."""

    settings: dict[str, Any] | None = None  # DistillSettings as a dict
    compute_dtype: str | None = (
        None  # the dtype the steps ran in (settings.parallel.dtype resolved on this machine)
    )
    steps: int | None = None
    micro_batch: int | None = None  # blocks per forward as run (--micro-batch auto resolved)
    train_tokens: int | None = None
    # --continue-from: the data's tokens the continued runs trained before this one
    continued_tokens: int | None = None
    train_seconds: float | None = None
    tokens_per_second: float | None = None
    compute_bound: ComputeBound | None = None  # since 2026-11-28
    heldout_before: HeldOut | None = None
    heldout_after: HeldOut | None = None
    final_loss: float | None = None
    # Peak memory the steps added above the model they train, MiB per process (CPU: resident set; CUDA:
    # allocated): gradients, optimizer state and activations, to check `swiftkv distill --plan` against
    step_memory_mib: float | None = None
    step_tensor_mib: float | None = None  # the same, tensor by tensor (memory.TensorBytes), first two steps
    history: list[dict] | None = None  # held-out evaluations and per-step losses, in step order
