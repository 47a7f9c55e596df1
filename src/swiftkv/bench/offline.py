"""SwiftKV vs its baseline on vLLM, measured in one run with the same settings (the library behind
`swiftkv bench`).

Each model gets its own engine in its own child process; the parent measures the matmul peak in the
engines' dtype, then drives the two engines in turn, workload by workload (alternating who goes
first), so load from other processes on the machine hits both sides alike; `bench` writes JSON and
a PNG and returns the report (`format_table` renders it). Numbers are ratios within one run.

Workloads (random token ids, prefix caching off so nothing is served from cache):
  prefill   16 prompts x 2000 tokens, max_tokens=1                      -> prompt tokens/s
  ttft      one 2000-token prompt, max_tokens=1, median of 5            -> seconds
  tpot      8 x (500 in, 64 out) minus the same batch with 1 out, / 63  -> seconds per output token
  e2e       32 x (2000 in, 200 out), the paper's 10:1 workload           -> requests/s and tokens/s
  kv        KV-cache capacity in tokens at the same KV memory (on CUDA without --kv-cache-memory: at the
            same gpu_memory_utilization, from which vLLM subtracts each model's own weights)
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from transformers import AutoConfig

from ..dtypes import AUTO, DTYPE_CHOICES, describe_choice, dtype_name, resolve_dtype
from ..files import write_atomic
from ..flops import prefill_flops_per_token
from ..peaks import matmul_peak
from ..plots import figure
from ..results import BenchResults
from ..settings import setting
from ..sources import Source, check_weights_present, open_source
from ..vllm.engine import KV_CACHE_BYTES, engine_kwargs, kv_cache_bytes, kv_cache_tokens
from ..vllm.env import configure_cpu_env
from ..vllm.serve import parse_bytes

WORKLOAD_NAMES = ("prefill", "ttft", "tpot", "e2e")
KV_AUTO = "auto"  # --kv-cache-memory: vLLM's sizing on CUDA, KV_CACHE_BYTES on the CPU build
GPU_SHARE = 0.45  # of the GPU per engine on CUDA with auto: half of vLLM's own default (0.9) each


def parse_workloads(text: str) -> tuple[str, ...]:
    """'prefill,ttft' -> the named workloads, in the benchmark's own order."""
    names = {part.strip() for part in text.split(",") if part.strip()}
    unknown = sorted(names - set(WORKLOAD_NAMES))
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected a comma-separated subset of {','.join(WORKLOAD_NAMES)}"
        )
    return tuple(name for name in WORKLOAD_NAMES if name in names)


@dataclass
class BenchSettings:
    """What `swiftkv bench` compares (the SwiftKV model and its baseline) and runs with; both engines get the
    same values."""

    model: str | Source = setting(None, "the SwiftKV model (folder, alias or Hub repo id)", cli=False)
    baseline: str | Source = setting(None, "the model it was converted from, served the same way", cli=False)
    revision: str | None = setting(None, "MODEL's revision (branch, tag or commit) when it is a Hub repo id")
    baseline_revision: str | None = setting(
        None, "--baseline's revision (branch, tag or commit) when it is a Hub repo id"
    )
    kv_cache_memory: str = setting(
        KV_AUTO,
        "KV-cache memory for each engine: bytes or e.g. 2G, 512M; auto: on CUDA vLLM's own sizing at "
        f"gpu_memory_utilization {GPU_SHARE} each (both engines share the GPU), {KV_CACHE_BYTES // 2**30}G on "
        "vLLM's CPU build",
    )
    max_model_len: int = setting(4096, "longest sequence each engine accepts")
    dtype: str = setting(
        AUTO,
        "compute dtype of both engines; auto is bf16 where the hardware has it natively, else fp32",
        choices=DTYPE_CHOICES,
    )
    enforce_eager: bool = setting(False, "skip torch.compile (faster start, slower run)")
    quick: bool = setting(False, "tiny workloads: checks the pipeline, not for numbers")
    workloads: tuple[str, ...] = setting(
        WORKLOAD_NAMES,
        "offline workloads to run, comma-separated subset of "
        "prefill,ttft,tpot,e2e (e.g. prefill,ttft to compare dtypes quickly); "
        "the KV capacity is always reported",
        parse=parse_workloads,
    )
    out: str = setting("bench-out", "output folder for bench.json and bench.png")

    def opened(self) -> BenchSettings:
        """These settings with both models' sources resolved, once, as a benchmark starts. Each must hold
        weights: a folder holding only a config.json is refused here, before any engine starts."""
        model, baseline = (
            open_source(self.model, self.revision),
            open_source(self.baseline, self.baseline_revision),
        )
        for source in (model, baseline):
            check_weights_present(source.folder)
        return replace(self, model=model, baseline=baseline)


def engine_settings(settings: BenchSettings, on_cuda: bool | None = None) -> dict:
    """The engine options both models run with (overrides for `swiftkv.vllm.engine.engine_kwargs`);
    prefix caching is off so no workload is served from cache."""
    return {
        **memory_settings(settings, torch.cuda.is_available() if on_cuda is None else on_cuda),
        "max_model_len": settings.max_model_len,
        "enable_prefix_caching": False,
        "dtype": dtype_name(resolve_dtype(settings.dtype)),
        "enforce_eager": settings.enforce_eager,
    }


def memory_settings(settings: BenchSettings, on_cuda: bool) -> dict:
    """The KV size given, or the CPU build's fixed one (`engine.kv_cache_bytes`); on CUDA otherwise vLLM sizes
    the cache from gpu_memory_utilization, at GPU_SHARE since both engines are alive on one GPU at once."""
    requested = None if settings.kv_cache_memory == KV_AUTO else parse_bytes(settings.kv_cache_memory)
    kv_bytes = kv_cache_bytes(on_cuda, requested)
    return {"gpu_memory_utilization": GPU_SHARE} if kv_bytes is None else {"kv_cache_memory_bytes": kv_bytes}


@dataclass
class Workloads:
    prefill_prompts: int = 16
    prefill_len: int = 2000
    ttft_len: int = 2000
    ttft_repeats: int = 5
    tpot_prompts: int = 8
    tpot_len: int = 500
    tpot_out: int = 64
    e2e_prompts: int = 32
    e2e_len: int = 2000
    e2e_out: int = 200

    @classmethod
    def quick(cls) -> Workloads:
        """A few seconds per model: for tests and smoke runs, not for numbers."""
        return cls(
            prefill_prompts=4,
            prefill_len=256,
            ttft_len=256,
            ttft_repeats=3,
            tpot_prompts=2,
            tpot_len=64,
            tpot_out=8,
            e2e_prompts=4,
            e2e_len=256,
            e2e_out=16,
        )


# --------------------------------------------------------------------------------------------------
# Worker side: one model, one engine
# --------------------------------------------------------------------------------------------------


class PromptMaker:
    """Fresh random token-id prompts (never repeated, so no cache hits even with prefix caching)."""

    def __init__(self, vocab_size: int, seed: int = 0):
        self.generator = torch.Generator().manual_seed(seed)
        self.high = min(vocab_size, 32000)

    def __call__(self, count: int, length: int) -> list[dict]:
        ids = torch.randint(100, self.high, (count, length), generator=self.generator)
        return [{"prompt_token_ids": row.tolist()} for row in ids]


def timed_generate(llm, prompts: list[dict], max_tokens: int) -> float:
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    started = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - started
    assert all(len(o.outputs[0].token_ids) == max_tokens for o in outputs)
    return elapsed


def measure(llm, make: PromptMaker, w: Workloads, name: str) -> dict:
    """One workload on one engine; returns the raw timings it produced."""
    if name == "warmup":  # first-call costs are not the model's
        return {"warmup_s": timed_generate(llm, make(2, w.prefill_len), 2)}
    if name == "prefill":
        return {
            "prefill_tok_s": w.prefill_prompts
            * w.prefill_len
            / timed_generate(llm, make(w.prefill_prompts, w.prefill_len), 1)
        }
    if name == "ttft":
        return {"ttft_s": timed_generate(llm, make(1, w.ttft_len), 1)}
    if name == "tpot":
        prefill_only = timed_generate(llm, make(w.tpot_prompts, w.tpot_len), 1)
        total = timed_generate(llm, make(w.tpot_prompts, w.tpot_len), w.tpot_out)
        return {"tpot_s": max(total - prefill_only, 0.0) / (w.tpot_out - 1)}
    if name == "e2e":
        elapsed = timed_generate(llm, make(w.e2e_prompts, w.e2e_len), w.e2e_out)
        return {
            "e2e_req_s": w.e2e_prompts / elapsed,
            "e2e_tok_s": w.e2e_prompts * (w.e2e_len + w.e2e_out) / elapsed,
        }
    raise ValueError(f"unknown workload {name!r}")


def worker_loop(connection, model: str, settings: dict, workloads: dict) -> None:
    """Child process: build one engine, report its facts, then run workloads on request until None."""
    configure_cpu_env()
    from vllm import LLM

    started = time.perf_counter()
    llm = LLM(**engine_kwargs(model, **settings))
    config = llm.llm_engine.vllm_config.model_config.hf_config
    connection.send(
        {
            "engine_startup_s": time.perf_counter() - started,
            "kv_cache_tokens": kv_cache_tokens(llm),
            "architecture": type(config).__name__,
            "fast_prefill": llm.llm_engine.vllm_config.cache_config.kv_sharing_fast_prefill,
        }
    )
    make, w = PromptMaker(config.vocab_size), Workloads(**workloads)
    while (name := connection.recv()) is not None:
        connection.send(measure(llm, make, w, name))
    llm.llm_engine.engine_core.shutdown()


class Worker:
    """A model's engine in its own process, driven over a pipe (`loop`: the child's side, `worker_loop`'s
    protocol)."""

    def __init__(self, label: str, model: str, settings: dict, workloads: Workloads, loop=worker_loop):
        context = multiprocessing.get_context("spawn")
        self.label = label
        self.connection, child = context.Pipe()
        print(f"[bench] starting {label}: {model}", file=sys.stderr, flush=True)
        self.process = context.Process(target=loop, args=(child, model, settings, asdict(workloads)))
        self.process.start()
        self.facts = self.receive()

    def receive(self) -> dict:
        while not self.connection.poll(5):
            if not self.process.is_alive():
                raise RuntimeError(
                    f"benchmark engine for {self.label} exited with code {self.process.exitcode}"
                )
        return self.connection.recv()

    def run(self, name: str) -> dict:
        print(f"[bench] {self.label}: {name}", file=sys.stderr, flush=True)
        self.connection.send(name)
        return self.receive()

    def close(self) -> None:
        if self.process.is_alive():
            self.connection.send(None)
            self.process.join(timeout=120)
        if self.process.is_alive():
            self.process.kill()


def run_interleaved(
    workers: list[Worker], workloads: Workloads, names: tuple[str, ...] = WORKLOAD_NAMES
) -> list[dict]:
    """Every named workload on every engine, alternating engines (and who goes first), so load from
    other processes on the machine hits both sides alike. TTFT is the median of its repeats."""
    schedule = ["warmup"]
    for name in names:
        schedule += [name] * (workloads.ttft_repeats if name == "ttft" else 1)
    results = [{**w.facts, "ttft_runs": []} for w in workers]
    for step, name in enumerate(schedule):
        order = list(range(len(workers)))[:: 1 if step % 2 == 0 else -1]
        for i in order:
            measured = workers[i].run(name)
            if name == "ttft":
                results[i]["ttft_runs"].append(measured["ttft_s"])
            else:
                results[i].update(measured)
    for result in results:
        if result["ttft_runs"]:
            result["ttft_s"] = statistics.median(result["ttft_runs"])
    return results


# --------------------------------------------------------------------------------------------------
# Parent side
# --------------------------------------------------------------------------------------------------


METRICS = [  # key, label, higher is better
    ("prefill_tok_s", "prefill throughput (tok/s)", True),
    ("ttft_s", "TTFT, 1 prompt (s)", False),
    ("tpot_s", "TPOT, batch of 8 (s/token)", False),
    ("e2e_req_s", "10:1 end-to-end (req/s)", True),
    ("e2e_tok_s", "10:1 end-to-end (tok/s)", True),
    ("e2e_prefill_s", "  10:1: prompts at prefill rate (s)", False),
    ("e2e_rest_s", "  10:1: the rest, decode (s)", False),
    ("kv_cache_tokens", "KV-cache capacity (tokens)", True),
    ("prefill_utilization", "normalized prefill utilization", True),
]


def measured_metrics(report: BenchResults | dict) -> list[tuple[str, str, bool]]:
    """The METRICS rows this run measured (a --workloads subset leaves some out)."""
    return [row for row in METRICS if row[0] in BenchResults.of(report).baseline]


def compare(baseline: dict, swiftkv: dict) -> dict:
    return {
        key: swiftkv[key] / baseline[key] if baseline[key] else None for key, *_ in METRICS if key in baseline
    }


def add_e2e_breakdown(result: dict, w: Workloads) -> None:
    """Where the 10:1 time goes: its prompts at the measured prefill rate, and the rest (decode)."""
    e2e_s = w.e2e_prompts / result["e2e_req_s"]
    result["e2e_prefill_s"] = w.e2e_prompts * w.e2e_len / result["prefill_tok_s"]
    result["e2e_rest_s"] = max(e2e_s - result["e2e_prefill_s"], 0.0)


def format_table(report: BenchResults | dict) -> str:
    report = BenchResults.of(report)
    rows = [f"{'metric':<34}{'baseline':>14}{'SwiftKV':>14}{'ratio':>9}  better"]
    for key, label, higher in measured_metrics(report):
        b, s, r = report.baseline[key], report.swiftkv[key], report.ratio[key]
        ratio = "n/a" if r is None else f"{r:.3f}"  # a zero baseline (e.g. no decode share left)
        rows.append(f"{label:<34}{b:>14.4g}{s:>14.4g}{ratio:>9}  {'higher' if higher else 'lower'}")
    rows.append(
        f"{report.settings['dtype']} matmul peak: {report.peak_flops / 1e9:.0f} GFLOP/s; "
        f"baseline prefill FLOPs/token {report.flops_per_token / 1e6:.0f} M"
    )
    return "\n".join(rows)


def plot(report: BenchResults | dict, path: Path) -> None:
    report = BenchResults.of(report)
    metrics = measured_metrics(report)
    labels = [label for _, label, *_ in metrics]
    # A ratio is None when the baseline's value is 0 (e.g. no decode share left); draw no bar for it.
    ratios = [report.ratio[key] or 0.0 for key, *_ in metrics]
    with figure(path, (9, 4), dpi=120) as (_, axis):
        axis.barh(labels, ratios, color="tab:blue")
        axis.axvline(1.0, color="black", linewidth=0.8)
        axis.invert_yaxis()
        axis.set_xlabel("SwiftKV / baseline")
        axis.set_title(f"SwiftKV vs baseline on vLLM, {report.settings['dtype']}: {Path(report.model).name}")


def bench(settings: BenchSettings, workloads: Workloads | None = None) -> BenchResults:
    """Run both models with identical settings and workloads (default: full, or quick when
    `settings.quick`); write bench.json and bench.png to `settings.out` and return the report."""
    engine = engine_settings(settings)
    workloads = workloads or (Workloads.quick() if settings.quick else Workloads())
    print(f"[bench] {describe_choice(settings.dtype)}", file=sys.stderr, flush=True)
    settings = settings.opened()
    model_dir, baseline_dir = os.fspath(settings.model), os.fspath(settings.baseline)
    out_dir = Path(settings.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    peak = matmul_peak(resolve_dtype(settings.dtype))
    workers = []
    try:
        for label, path in (("baseline", baseline_dir), ("SwiftKV", model_dir)):
            workers.append(Worker(label, path, engine, workloads))
        base, swift = run_interleaved(workers, workloads, settings.workloads)
    finally:
        for worker in workers:
            worker.close()

    flops = prefill_flops_per_token(AutoConfig.from_pretrained(baseline_dir), workloads.prefill_len)
    for result in (base, swift):
        if "prefill_tok_s" in result:  # a --workloads subset may leave prefill (and so these) out
            result["prefill_utilization"] = result["prefill_tok_s"] * flops / peak
            if "e2e_req_s" in result:
                add_e2e_breakdown(result, workloads)
    report = {
        "model": str(settings.model),
        "baseline_model": str(settings.baseline),
        "settings": engine,
        "workloads": asdict(workloads),
        "measured": list(settings.workloads),
        "peak_flops": peak,
        "flops_per_token": flops,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "baseline": base,
        "swiftkv": swift,
        "ratio": compare(base, swift),
    }
    write_atomic(out_dir / "bench.json", json.dumps(report, indent=2))
    plot(report, out_dir / "bench.png")
    return BenchResults.from_json(report)
