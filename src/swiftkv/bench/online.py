"""Online serving benchmark (`swiftkv bench MODEL --baseline TEACHER --online`): both models behind
vLLM's OpenAI server under Poisson request arrivals, at several request rates.

The baseline is plain vLLM serving the teacher; SwiftKV is served by `swiftkv serve`; both get the
same options (dtype, KV memory, max model length, prefix caching off, eager or compiled). One server
runs at a time, so they never share the CPU. Rates are interleaved and the order alternates (B S | S B
| B S ...), so a server stays up across the two rates it runs back to back and load from other
processes drifts over both models alike.

Each model's first session starts with a warm-up and a few sequential requests on the idle server.
The baseline's idle TTFT sets the default rates (`--rate-multipliers` x 1 / idle TTFT, see
`online_metrics.default_rates`) and the default SLO (3 x its idle TTFT and TPOT).

Workloads (`online_prompts`): the paper's 10:1 (ShareGPT text cut to `prompt_len` tokens), or
extractive (passages + a question, a document + a summary request, chat-templated), both sent as token
ids to /v1/completions, `output_len` output tokens with ignore_eos. The client is vLLM's own serving
benchmark (`online_client`: its Poisson arrivals, seeded per rate so both models get the same
schedule, its streaming requests and its metrics); our rows from its results and the SLO search:
`online_metrics`; table and plot: `online_report`.

Speculative decoding: `speculative_config` (vLLM's --speculative-config JSON, checked against what
runs with SwiftKV by `swiftkv.vllm.speculative` before any server starts) goes to both servers
(`speculate="both"`: the same speculator on each) or to SwiftKV's only (`speculate="swiftkv"`:
SwiftKV + speculator against the plain baseline). Each rate then also reports each speculating
server's acceptance rate, which vLLM's benchmark reads from the server's /metrics counters before and
after the rate.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from ..dtypes import describe_choice
from ..files import write_atomic
from ..results import OnlineResults
from ..settings import setting
from ..sources import load_tokenizer
from ..vllm.speculative import NGRAM_EXAMPLE, check_speculative_config, speculative_options
from .offline import engine_settings
from .online_client import Target, run, spec_counters_exposed
from .online_metrics import MODELS, SLO, choose_slo, compare, default_rates, idle_latency, rate_row
from .online_prompts import WORKLOADS, build_prompts
from .online_report import plot, side_label
from .online_server import (
    baseline_command,
    free_port,
    running_server,
    server_args,
    server_env,
    speculative_args,
    swiftkv_command,
)

SPECULATE = ("both", "swiftkv")  # which servers get the speculative config


def parse_rates(text: str) -> tuple[float, ...]:
    """'0.05,0.1,0.2' -> positive floats."""
    try:
        values = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of numbers") from None
    if not values or any(not math.isfinite(v) or v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: expected positive numbers, e.g. 0.05,0.1,0.2")
    return values


def parse_speculative_config(text: str) -> dict:
    """vLLM's --speculative-config JSON -> dict, refused at once (one message saying why and what
    works) when it is not JSON or names a method that cannot run with SwiftKV."""
    try:
        config = speculative_options(["--speculative-config", text])
        if not config:
            raise ValueError(f"{text!r} names no speculative method; expected e.g. '{NGRAM_EXAMPLE}'")
        check_speculative_config(config)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return config


@dataclass
class OnlineSettings:
    """What `swiftkv bench --online` runs with, besides BenchSettings' server options (dtype, KV
    memory, max model length, eager), which both servers share."""

    rates: tuple[float, ...] | None = setting(
        None,
        "request rates in requests/s, comma-separated (e.g. 0.05,0.1,0.2); default: --rate-multipliers "
        "x the baseline's prefill-bound capacity, 1 / its idle TTFT",
        parse=parse_rates,
    )
    rate_multipliers: tuple[float, ...] = setting(
        (0.25, 0.5, 0.75, 1.0, 1.5, 2.0),
        "default rates as multiples of 1 / the baseline's idle TTFT",
        parse=parse_rates,
    )
    num_requests: int = setting(64, "requests per model and rate (p99 of 64 is close to their maximum)")
    prompt_len: int = setting(2000, "prompt tokens per request")
    output_len: int = setting(
        200, "output tokens per request (ignore_eos: every request makes exactly this many)"
    )
    slo_ttft: float = setting(
        0.0, "SLO on p99 TTFT in seconds; 0: --slo-ttft-factor x the baseline's idle TTFT"
    )
    slo_ttft_factor: float = setting(3.0, "SLO on p99 TTFT as a multiple of the baseline's idle TTFT")
    slo_tpot: float = setting(
        0.0, "SLO on p99 TPOT in seconds; 0: --slo-tpot-factor x the baseline's idle TPOT"
    )
    slo_tpot_factor: float = setting(3.0, "SLO on p99 TPOT as a multiple of the baseline's idle TPOT")
    idle_requests: int = setting(3, "sequential requests on each idle server (medians: idle TTFT and TPOT)")
    warmup_requests: int = setting(2, "sequential requests after each server start, not measured")
    workload: str = setting(
        "sharegpt",
        "the prompts: sharegpt (the paper's 10:1, ShareGPT text cut to --prompt-len "
        "tokens) or extractive (passages + a question, a document + a summary request, "
        "chat-templated, at most --prompt-len tokens)",
        choices=WORKLOADS,
    )
    speculative_config: dict | None = setting(
        None,
        f"speculative decoding, vLLM's --speculative-config JSON, e.g. '{NGRAM_EXAMPLE}' (only methods that "
        "run with SwiftKV); see --speculate for which servers get it",
        parse=parse_speculative_config,
    )
    speculate: str = setting(
        "both",
        "with --speculative-config: both (the same speculator on each server) or "
        "swiftkv (SwiftKV + speculator against the plain baseline)",
        choices=SPECULATE,
    )
    seed: int = setting(
        0,
        "seed of the Poisson arrival times, with the rate's index (both models get the same schedule at a rate)",
    )
    server_timeout: float = setting(1800.0, "seconds to wait for a server to answer /health")


# --quick: checks the pipeline end to end in a few minutes on a CPU, not for numbers. It also runs
# the servers eager (no torch.compile), which is most of a server's start-up time.
QUICK = {
    "rate_multipliers": (0.5, 2.0),
    "num_requests": 6,
    "prompt_len": 128,
    "output_len": 8,
    "idle_requests": 2,
    "warmup_requests": 1,
}


def online_settings(given: dict, quick: bool = False) -> OnlineSettings:
    """The settings the user gave, over the quick ones when `quick`, over the defaults."""
    return OnlineSettings(**({**QUICK, **given} if quick else given))


def check_settings(online: OnlineSettings, max_model_len: int) -> None:
    if online.output_len < 2:
        raise ValueError("--output-len must be at least 2 (TPOT is the time per token after the first)")
    if online.prompt_len + online.output_len > max_model_len:
        raise ValueError(
            f"--prompt-len {online.prompt_len} + --output-len {online.output_len} exceeds "
            f"--max-model-len {max_model_len}"
        )
    if min(online.num_requests, online.idle_requests) < 1:
        raise ValueError("--num-requests and --idle-requests must be at least 1")
    if online.workload not in WORKLOADS:
        raise ValueError(f"--workload {online.workload!r}: expected one of {', '.join(WORKLOADS)}")
    if online.speculate not in SPECULATE:
        raise ValueError(f"--speculate {online.speculate!r}: expected one of {', '.join(SPECULATE)}")
    check_speculative_config(online.speculative_config)  # settings built in code skip the option's check


def speculative_configs(online: OnlineSettings) -> dict[str, dict | None]:
    """Each server's speculative config (None: it does not speculate)."""
    config = online.speculative_config or None
    return {"baseline": config if online.speculate == "both" else None, "swiftkv": config}


# --------------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------------


def sessions(rate_count: int) -> list[tuple[str, list[int]]]:
    """Server sessions as (model, rate indices): rate i runs baseline then SwiftKV for even i, the
    other way round for odd i; back-to-back runs of one model share a server."""
    order = [(MODELS[(i + k) % 2], i) for i in range(rate_count) for k in (0, 1)]
    grouped: list[tuple[str, list[int]]] = []
    for model, index in order:
        if grouped and grouped[-1][0] == model:
            grouped[-1][1].append(index)
        else:
            grouped.append((model, [index]))
    return grouped


def json_ready(value):
    """NaN and infinities -> None (JSON has no such numbers)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    return value


@dataclass
class Server:
    label: str
    command: Callable[[list[str]], list[str]]  # server options -> command line


class OnlineRun:
    """One benchmark: the state that the sessions fill in (rates and SLO after the baseline's idle
    requests, results per model and rate) and the report they are written to after every rate."""

    def __init__(
        self,
        model_dir: str,
        baseline_dir: str,
        engine: dict,
        online: OnlineSettings,
        out_dir: Path,
        report: dict,
    ):
        self.online, self.engine, self.out_dir, self.report = online, engine, out_dir, report
        self.speculative = speculative_configs(online)
        self.servers = {
            "baseline": Server(
                side_label("baseline", self.speculative["baseline"]),
                lambda args: baseline_command(baseline_dir, args),
            ),
            "swiftkv": Server(
                side_label("swiftkv", self.speculative["swiftkv"]),
                lambda args: swiftkv_command(model_dir, args),
            ),
        }
        self.env = server_env()
        self.rates: list[float] = list(online.rates) if online.rates else []
        self.slo: SLO | None = None
        # The SwiftKV model shares the baseline's tokenizer: the prompts' and the client's (which counts tokens).
        self.tokenizer = load_tokenizer(baseline_dir)
        self.prompts, report["workload"]["prompt_source"] = build_prompts(
            self.tokenizer, online.num_requests, online.prompt_len, online.workload
        )

    def session(self, number: int, model: str, rate_indices: list[int]) -> None:
        server, port = self.servers[model], free_port()
        base_url = f"http://127.0.0.1:{port}"
        log = self.out_dir / "online-logs" / f"{number:02d}-{model}.log"
        print(f"[online] starting {server.label} server (log {log})", file=sys.stderr, flush=True)
        command = server.command(
            server_args(self.engine, port, model) + speculative_args(self.speculative[model])
        )
        with running_server(command, self.env, base_url, log, self.online.server_timeout) as startup_s:
            target = Target(base_url, model, self.tokenizer, self.online.output_len)
            if self.online.warmup_requests:  # vLLM's benchmark needs at least one request
                run(target, self.prompts[: self.online.warmup_requests], max_concurrency=1)
            self.report["sessions"].append(
                {
                    "model": model,
                    "rates": rate_indices,
                    "startup_s": startup_s,
                    "log": str(log.relative_to(self.out_dir)),
                }
            )
            if self.speculative[model] and not spec_counters_exposed(base_url):
                raise RuntimeError(
                    f"the {server.label} server speculates but its /metrics page has no "
                    "vllm:spec_decode_* counters (were its stats disabled?)"
                )
            if model not in self.report["idle"]:
                self.measure_idle(target, model)
            for index in rate_indices:
                self.run_rate(target, model, index)

    def measure_idle(self, target: Target, model: str) -> None:
        requests = self.prompts[: self.online.idle_requests]
        idle = idle_latency(run(target, requests, max_concurrency=1), self.online.output_len)
        self.report["idle"][model] = idle
        print(
            f"[online] {model} idle: TTFT {idle['ttft_s']:.4g} s, TPOT {idle['tpot_s']:.4g} s",
            file=sys.stderr,
            flush=True,
        )
        if model == "baseline":  # the baseline's idle server defines the default rates and SLO
            o = self.online
            self.rates = self.rates or default_rates(idle["ttft_s"], o.rate_multipliers)
            self.slo = choose_slo(
                idle["ttft_s"], idle["tpot_s"], o.slo_ttft, o.slo_ttft_factor, o.slo_tpot, o.slo_tpot_factor
            )
            self.report["rates"] = self.rates
            self.report["slo"] = asdict(self.slo)
            print(
                f"[online] rates {', '.join(f'{r:.4g}' for r in self.rates)} req/s; SLO {self.slo.how}",
                file=sys.stderr,
                flush=True,
            )

    def run_rate(self, target: Target, model: str, index: int) -> None:
        rate = self.rates[index]
        print(f"[online] {self.servers[model].label} @ {rate:.4g} req/s", file=sys.stderr, flush=True)
        result = run(target, self.prompts, rate, slo=self.slo, seed=(self.online.seed, index), progress=True)
        speculating = self.speculative[model] is not None
        row = rate_row(result, rate, self.online.output_len, self.slo, speculating)
        self.report["results"][model][index] = row
        self.save()

    def save(self) -> None:
        results = self.report["results"]
        if all(row is not None for model in MODELS for row in results[model]):
            self.report["summary"] = compare(self.rates, results["baseline"], results["swiftkv"])
        write_atomic(self.out_dir / "online.json", json.dumps(json_ready(self.report), indent=2))


def online_bench(settings, online: OnlineSettings) -> OnlineResults:
    """Run the online benchmark of `settings.model` (SwiftKV) against `settings.baseline` (its teacher) with
    the server options of `settings` (a `swiftkv.bench.offline.BenchSettings`; --quick also runs eager); write
    OUT/online.json (after every rate) and OUT/online.png, and return the report."""
    engine = engine_settings(settings)
    engine["enforce_eager"] = engine["enforce_eager"] or settings.quick
    check_settings(online, engine["max_model_len"])
    print(f"[online] {describe_choice(settings.dtype)}", file=sys.stderr, flush=True)
    out_dir = Path(settings.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    rate_count = len(online.rates or online.rate_multipliers)
    report = {
        "model": str(settings.model),
        "baseline_model": str(settings.baseline),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "server_settings": engine,
        "online_settings": {f.name: getattr(online, f.name) for f in fields(online)},
        "workload": {
            "kind": online.workload,
            "prompt_len": online.prompt_len,
            "output_len": online.output_len,
            "num_requests": online.num_requests,
            "arrivals": "Poisson",
            "ignore_eos": True,
        },
        "speculative_config": speculative_configs(online),
        "rates": list(online.rates or []),
        "slo": None,
        "idle": {},
        "sessions": [],
        "results": {m: [None] * rate_count for m in MODELS},
        "summary": None,
    }
    opened = settings.opened()
    run = OnlineRun(os.fspath(opened.model), os.fspath(opened.baseline), engine, online, out_dir, report)
    for number, (name, indices) in enumerate(sessions(rate_count)):
        run.session(number, name, indices)
    run.save()
    plot(run.report, out_dir / "online.png")
    return OnlineResults.from_json(json_ready(run.report))
