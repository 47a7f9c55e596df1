"""Where the time of one mixed prefill/decode step goes, SwiftKV against its baseline (the library
behind `swiftkv bench --profile`).

The step profiled is the one online serving runs most: `decodes` requests already decoding, plus one
new `prompt_len`-token prompt that fits in the step's token budget. Each model gets its own process
with the engine core in it, so torch's profiler sees the model. The scenario runs three times: to
warm up (compilation for the shapes), timed without the profiler (median of 3), then under the
profiler.

Regions (`record_function` ranges): `model` is the causal LM's forward; inside it SwiftKV's model
marks `swiftkv:early` (embedding, layers < N and the K/V projection; compiled), `swiftkv:kv-write`
(the holders' cache writes), `swiftkv:rows` (picking the logits rows and putting them back) and
`swiftkv:late` (layers >= N on the logits rows; compiled). Everything in the step outside `model`
(scheduling, input preparation, logits, sampling) is vLLM's.

`decode_steps` (`swiftkv bench --decode-steps`) re-measures the decode-only step over many steps, not
one: `batch` sequences of `context_len` random prompt tokens are prefilled, then `warmup_steps` and
`steps` decode-only steps (every sequence one token per step, no prefill in them) are timed one by
one, with the same engine settings for both models; the medians give the SwiftKV / baseline ratio.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..files import write_atomic
from ..plots import figure
from ..results import DecodeStepsResults, ModelProfile, ProfileResults
from ..sources import Source
from ..vllm.engine import engine_kwargs, in_process_engine
from .offline import BenchSettings, PromptMaker, engine_settings

STEP, MODEL = "step", "model"
SWIFTKV_REGIONS = ("swiftkv:early", "swiftkv:kv-write", "swiftkv:rows", "swiftkv:late")
OURS = ("swiftkv:kv-write", "swiftkv:rows")  # eager glue of our model; the compiled parts hold vLLM layers
TOP_OPS = 15
TIMED_RUNS = 3  # the unprofiled step times are medians over this many runs


@dataclass
class DecodeScenario:
    batch: int = 8  # sequences decoding together, as the mixed-step scenario's decodes
    context_len: int = 2000  # prompt tokens of each: the online workload's prompt length
    steps: int = 128  # timed decode steps (the median is over these)
    warmup_steps: int = 8

    @classmethod
    def quick(cls) -> DecodeScenario:
        return cls(batch=2, context_len=32, steps=16, warmup_steps=2)


@dataclass
class Scenario:
    decodes: int = 8  # requests already decoding when the prompt arrives
    decode_len: int = 500
    prompt_len: int = 2000

    @classmethod
    def quick(cls) -> Scenario:
        return cls(decodes=2, decode_len=32, prompt_len=128)


# --------------------------------------------------------------------------------------------------
# Child side: one model, engine core in this process
# --------------------------------------------------------------------------------------------------


def range_hooks(module, name: str) -> None:
    """A `record_function` range around every forward of `module` (an eager module, so hooks run)."""
    open_ranges = []
    module.register_forward_pre_hook(
        lambda *_: open_ranges.append(torch.profiler.record_function(name).__enter__())
    )
    module.register_forward_hook(lambda *_: open_ranges.pop().__exit__(None, None, None))


def run_mixed_step(engine, make, scenario: Scenario, tag: str, profiler=None) -> dict:
    """Bring `decodes` requests into decode, add the prompt, run the mixed step (under `profiler` when
    given); returns the step's and a decode-only step's wall times. Leaves no request behind."""
    from vllm import SamplingParams

    decoding = [f"{tag}-decode-{i}" for i in range(scenario.decodes)]
    long_params = SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True)
    for request_id, prompt in zip(decoding, make(scenario.decodes, scenario.decode_len), strict=True):
        engine.add_request(request_id, prompt, long_params)
    produced: dict[str, int] = {}
    while len(produced) < len(decoding) or min(produced.values()) < 1:  # until every prompt is prefilled
        for output in engine.step():
            produced[output.request_id] = len(output.outputs[0].token_ids)
    started = time.perf_counter()
    engine.step()
    decode_s = time.perf_counter() - started
    engine.add_request(
        f"{tag}-prompt",
        make(1, scenario.prompt_len)[0],
        SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True),
    )
    started = time.perf_counter()
    if profiler is None:
        outputs = engine.step()
    else:
        with profiler, torch.profiler.record_function(STEP):
            outputs = engine.step()
    mixed_s = time.perf_counter() - started
    prompt_done = any(o.request_id == f"{tag}-prompt" and o.finished for o in outputs)
    engine.abort_request(decoding)
    while engine.has_unfinished_requests():
        engine.step()
    return {"mixed_step_s": mixed_s, "decode_step_s": decode_s, "prompt_in_one_step": prompt_done}


def time_decode_steps(engine, make, scenario: DecodeScenario) -> dict:
    """Prefill `batch` prompts, then time `steps` decode-only steps one by one (after the warm-up
    ones); each step must return one new token for every sequence, or it was not a pure decode step
    of the whole batch. Leaves no request behind."""
    from vllm import SamplingParams

    ids = [f"decode-{i}" for i in range(scenario.batch)]
    # Enough tokens that no sequence finishes inside the timed steps.
    params = SamplingParams(
        max_tokens=scenario.warmup_steps + scenario.steps + 2, temperature=0.0, ignore_eos=True
    )
    for request_id, prompt in zip(ids, make(scenario.batch, scenario.context_len), strict=True):
        engine.add_request(request_id, prompt, params)
    produced: dict[str, int] = {}
    while len(produced) < len(ids) or min(produced.values()) < 1:  # until every prompt is prefilled
        for output in engine.step():
            produced[output.request_id] = len(output.outputs[0].token_ids)
    times, full = [], True
    for step in range(scenario.warmup_steps + scenario.steps):
        started = time.perf_counter()
        outputs = engine.step()
        elapsed = time.perf_counter() - started
        grown = {o.request_id: len(o.outputs[0].token_ids) for o in outputs}
        full = full and all(grown.get(i) == produced[i] + 1 for i in ids)
        produced.update(grown)
        if step >= scenario.warmup_steps:
            times.append(elapsed)
    engine.abort_request(ids)
    while engine.has_unfinished_requests():
        engine.step()
    return {
        "step_s": times,
        "median_step_s": statistics.median(times),
        "mean_step_s": statistics.fmean(times),
        "every_step_decoded_the_whole_batch": full,
    }


def decode_steps_model(model: str, settings: dict, scenario: dict) -> dict:
    """Child process: build the engine in this process and time its decode-only steps."""
    with in_process_engine():
        from vllm import LLM

        llm = LLM(**engine_kwargs(model, **settings))
        make = PromptMaker(llm.llm_engine.vllm_config.model_config.hf_config.vocab_size)
        return time_decode_steps(llm.llm_engine, make, DecodeScenario(**scenario))


def region_times(profiler) -> dict:
    """Inclusive CPU time (s) of each named range, and the top operators by self time."""
    averages = profiler.key_averages()
    by_name = {event.key: event for event in averages}
    regions = {
        name: by_name[name].cpu_time_total / 1e6
        for name in (STEP, MODEL, *SWIFTKV_REGIONS)
        if name in by_name
    }
    operators = sorted(
        (e for e in averages if e.key not in regions), key=lambda e: e.self_cpu_time_total, reverse=True
    )
    top = [
        {"op": e.key, "self_s": e.self_cpu_time_total / 1e6, "calls": e.count} for e in operators[:TOP_OPS]
    ]
    return {"regions": regions, "top_ops": top}


def profile_model(model: str, settings: dict, scenario: dict) -> dict:
    """Child process: build the engine in this process, run the scenario warm, timed and profiled."""
    with in_process_engine():  # vLLM is imported under the engine's environment
        from vllm import LLM

        llm = LLM(**engine_kwargs(model, **settings))
        llm.apply_model(lambda m: range_hooks(m, MODEL))
        engine, s = llm.llm_engine, Scenario(**scenario)
        make = PromptMaker(llm.llm_engine.vllm_config.model_config.hf_config.vocab_size)
        run_mixed_step(engine, make, s, "warm")
        runs = [run_mixed_step(engine, make, s, f"timed-{i}") for i in range(TIMED_RUNS)]
        timed = {
            key: statistics.median(run[key] for run in runs) for key in ("mixed_step_s", "decode_step_s")
        }
        timed["prompt_in_one_step"] = all(run["prompt_in_one_step"] for run in runs)
        profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
        profiled = run_mixed_step(engine, make, s, "profiled", profiler)
        return {**timed, "profiled_step_s": profiled["mixed_step_s"], **region_times(profiler)}


# --------------------------------------------------------------------------------------------------
# Parent side
# --------------------------------------------------------------------------------------------------


def breakdown(result: ModelProfile) -> dict:
    """The step's profiled time in parts (s): our glue, the compiled model parts, and vLLM's rest."""
    regions = result.regions
    step, model = regions.get(STEP, 0.0), regions.get(MODEL, 0.0)
    parts = {"model forward": model}
    parts.update({name: regions[name] for name in SWIFTKV_REGIONS if name in regions})
    parts["rest of the step (vLLM: scheduling, inputs, logits, sampling)"] = max(step - model, 0.0)
    parts["ours (kv-write + rows)"] = sum(regions.get(name, 0.0) for name in OURS)
    return parts


def format_table(report: ProfileResults | dict) -> str:
    report = ProfileResults.of(report)
    s = Scenario(**report.scenario)
    base, swift = report.baseline, report.swiftkv
    rows = [
        f"one mixed step: {s.decodes} decoding requests + one {s.prompt_len}-token prompt "
        f"({report.settings['dtype']})",
        f"{'':<62}{'baseline ms':>12}{'SwiftKV ms':>12}",
    ]

    def row(label, b, w):
        rows.append(
            f"{label:<62}{'-' if b is None else f'{b * 1e3:.1f}':>12}{'-' if w is None else f'{w * 1e3:.1f}':>12}"
        )

    row("mixed step, unprofiled (median of 3)", base.mixed_step_s, swift.mixed_step_s)
    row("decode-only step, unprofiled (median of 3)", base.decode_step_s, swift.decode_step_s)
    row("mixed step under the profiler", base.regions.get(STEP), swift.regions.get(STEP))
    base_parts, swift_parts = breakdown(base), breakdown(swift)
    for label in swift_parts:
        row(f"  {label}", base_parts.get(label), swift_parts[label])
    for label, result in (("baseline", base), ("SwiftKV", swift)):
        rows.append(f"top operators by self time, {label}:")
        rows += [f"  {op.op[:58]:<58}{op.self_s * 1e3:>10.1f} ms  x{op.calls}" for op in result.top_ops]
    return "\n".join(rows)


def each_model(work, model: Source, baseline: Source, settings: dict, scenario: dict) -> dict:
    """`work(folder, settings, scenario)` for the baseline, then SwiftKV, each in its own spawned
    process (the engine core runs in it, and each model gets a fresh one)."""

    results = {}
    for label, source in (("baseline", baseline), ("swiftkv", model)):
        print(f"[profile] {label}: {source}", file=sys.stderr, flush=True)
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            results[label] = pool.submit(work, os.fspath(source), settings, scenario).result()
    return results


def both_models_report(work, bench: BenchSettings, scenario, path: Path, derived=lambda results: {}) -> dict:
    """`work` on both models of `bench` (`each_model`, their sources opened once), the report of the run
    (with `derived(results)` added), written atomically to `path`."""
    settings, opened = engine_settings(bench), bench.opened()
    results = each_model(work, opened.model, opened.baseline, settings, asdict(scenario))
    report = {
        "model": opened.model.name,
        "baseline_model": opened.baseline.name,
        "settings": settings,
        "scenario": asdict(scenario),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        **results,
        **derived(results),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(report, indent=2))
    return report


def profile(bench: BenchSettings, scenario: Scenario) -> ProfileResults:
    """Profile the mixed step of both models (one process each, one after the other); write
    OUT/profile.json and return the report."""
    return ProfileResults.from_json(
        both_models_report(profile_model, bench, scenario, Path(bench.out) / "profile.json")
    )


def decode_steps(bench: BenchSettings, scenario: DecodeScenario) -> DecodeStepsResults:
    """Time both models' decode-only steps (one process each, same settings); write
    OUT/decode-steps.json and OUT/decode-steps.png and return the report."""
    out = Path(bench.out)
    report = both_models_report(
        decode_steps_model,
        bench,
        scenario,
        out / "decode-steps.json",
        lambda results: {
            "median_step_ratio": results["swiftkv"]["median_step_s"] / results["baseline"]["median_step_s"]
        },
    )
    plot_decode_steps(report, out / "decode-steps.png")
    return DecodeStepsResults.from_json(report)


def format_decode_steps(report: DecodeStepsResults | dict) -> str:
    report = DecodeStepsResults.of(report)
    s = DecodeScenario(**report.scenario)
    base, swift = report.baseline, report.swiftkv
    rows = [
        f"decode-only steps: {s.batch} sequences of {s.context_len} prompt tokens, {s.steps} steps "
        f"timed after {s.warmup_steps} ({report.settings['dtype']})",
        f"{'':<28}{'baseline ms':>12}{'SwiftKV ms':>12}{'ratio':>8}",
    ]
    for label, b, w in (
        ("median step", base.median_step_s, swift.median_step_s),
        ("mean step", base.mean_step_s, swift.mean_step_s),
    ):
        rows.append(f"{label:<28}{b * 1e3:>12.2f}{w * 1e3:>12.2f}{w / b:>8.3f}")
    if not (base.every_step_decoded_the_whole_batch and swift.every_step_decoded_the_whole_batch):
        rows.append(
            "warning: some timed step did not decode every sequence (not a pure decode step of the batch)"
        )
    return "\n".join(rows)


def plot_decode_steps(report: DecodeStepsResults | dict, path: Path) -> None:
    """Each timed step's wall time, both models, medians dashed: drift or outliers show at a glance."""
    report = DecodeStepsResults.of(report)
    with figure(path, (8, 4)) as (_, axis):
        for result, label, color in (
            (report.baseline, "baseline", "tab:gray"),
            (report.swiftkv, "SwiftKV", "tab:blue"),
        ):
            times = [t * 1e3 for t in result.step_s]
            axis.plot(range(len(times)), times, ".", color=color, label=label)
            axis.axhline(result.median_step_s * 1e3, color=color, linestyle="--", linewidth=1)
        s = DecodeScenario(**report.scenario)
        axis.set(
            xlabel="decode step",
            ylabel="step time (ms)",
            title=f"decode-only steps, {s.batch} x {s.context_len} tokens: "
            f"SwiftKV / baseline median {report.median_step_ratio:.3f}",
        )
        axis.grid(alpha=0.3)
        axis.legend()
