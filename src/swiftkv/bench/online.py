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
ids to /v1/completions, `output_len` output tokens with ignore_eos. Requests stream; vLLM's own request
function (`vllm.benchmarks.lib`) times each token. Metrics: `online_metrics`; table and plot:
`online_report`.

Speculative decoding: `speculative_config` (vLLM's --speculative-config JSON, checked against what
runs with SwiftKV by `swiftkv.vllm.speculative` before any server starts) goes to both servers
(`speculate="both"`: the same speculator on each) or to SwiftKV's only (`speculate="swiftkv"`:
SwiftKV + speculator against the plain baseline). Each rate then also reports each speculating
server's acceptance rate, from vLLM's counters on its /metrics page read before and after the rate.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

from tqdm import tqdm

from ..dtypes import describe_choice
from ..files import write_atomic
from ..results import OnlineResults
from ..settings import setting
from ..vllm.speculative import NGRAM_EXAMPLE, check_speculative_config, speculative_options
from .offline import engine_settings
from .online_metrics import (
    MODELS,
    SLO,
    RequestResult,
    acceptance,
    choose_slo,
    compare,
    default_rates,
    idle_summary,
    poisson_arrivals,
    spec_decode_counters,
    summarize,
)
from .online_prompts import WORKLOADS, build_prompts
from .online_report import plot, side_label
from .online_server import (
    baseline_command,
    free_port,
    metrics_text,
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
    seed: int = setting(0, "seed of the Poisson arrival times (both models get the same schedule at a rate)")
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
# Client: vLLM's streaming request function, our Poisson schedule
# --------------------------------------------------------------------------------------------------


def to_result(output, output_len: int) -> RequestResult:
    """vLLM's RequestFuncOutput -> RequestResult; a request that made a different number of tokens
    than asked (ignore_eos makes it exact) counts as failed."""
    tokens = output.output_tokens or (len(output.itl) + 1 if output.success else 0)
    result = RequestResult(
        ttft=output.ttft,
        latency=output.latency,
        itl=list(output.itl),
        output_tokens=tokens,
        prompt_tokens=output.prompt_len,
        success=output.success,
        error=output.error[-1000:],
    )
    if result.success and tokens != output_len:
        result.success, result.error = False, f"made {tokens} tokens, expected {output_len}"
    return result


class Client:
    """Streams completions from one server with vLLM's benchmark request function."""

    def __init__(self, base_url: str, served_name: str, output_len: int):
        from vllm.benchmarks.lib.endpoint_request_func import (
            RequestFuncInput,
            async_request_openai_completions,
        )

        self.send = async_request_openai_completions
        self.base_url, self.output_len = base_url, output_len
        self.template = RequestFuncInput(
            prompt=[],
            api_url=base_url + "/v1/completions",
            prompt_len=0,
            output_len=output_len,
            model=served_name,
            ignore_eos=True,
            extra_body={"temperature": 0.0},
        )

    async def one(self, session, prompt: list[int]) -> RequestResult:
        request = replace(self.template, prompt=prompt, prompt_len=len(prompt))
        return to_result(await self.send(request_func_input=request, session=session), self.output_len)

    @staticmethod
    def session():
        import aiohttp

        # No connection limit: beyond saturation every queued request holds an open stream.
        return aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=6 * 3600)
        )

    async def sequential(self, prompts: list[list[int]]) -> list[RequestResult]:
        async with self.session() as session:
            return [await self.one(session, prompt) for prompt in prompts]

    async def poisson(
        self, prompts: list[list[int]], arrivals: list[float], label: str
    ) -> tuple[list[RequestResult], float]:
        """Send prompt i at arrivals[i] seconds from the start, without waiting for earlier answers;
        returns the results and the seconds from the first send to the last token."""
        async with self.session() as session:
            with tqdm(total=len(prompts), desc=label, unit="req", file=sys.stderr) as bar:
                started, tasks = time.perf_counter(), []
                for prompt, at in zip(prompts, arrivals, strict=True):
                    await asyncio.sleep(max(0.0, started + at - time.perf_counter()))
                    tasks.append(asyncio.create_task(self.one(session, prompt)))
                    tasks[-1].add_done_callback(lambda _: bar.update())
                results = await asyncio.gather(*tasks)
                return results, time.perf_counter() - started


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
        self.prompts, report["workload"]["prompt_source"] = build_prompts(
            baseline_dir, online.num_requests, online.prompt_len, online.workload
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
            client = Client(base_url, model, self.online.output_len)
            asyncio.run(client.sequential(self.prompts[: self.online.warmup_requests]))
            self.report["sessions"].append(
                {
                    "model": model,
                    "rates": rate_indices,
                    "startup_s": startup_s,
                    "log": str(log.relative_to(self.out_dir)),
                }
            )
            if model not in self.report["idle"]:
                self.measure_idle(client, model)
            for index in rate_indices:
                self.run_rate(client, model, index)

    def measure_idle(self, client: Client, model: str) -> None:
        idle = idle_summary(asyncio.run(client.sequential(self.prompts[: self.online.idle_requests])))
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

    def run_rate(self, client: Client, model: str, index: int) -> None:
        rate = self.rates[index]
        arrivals = poisson_arrivals(rate, len(self.prompts), seed=[self.online.seed, index])
        label = f"{self.servers[model].label} @ {rate:.4g} req/s"
        speculating = self.speculative[model] is not None
        before = self.spec_counters(client) if speculating else None
        results, duration = asyncio.run(client.poisson(self.prompts, arrivals, label))
        row = {"rate": rate, **summarize(results, duration, self.slo)}
        row["errors"] = sorted({r.error for r in results if not r.success})[:3]
        row["speculative"] = acceptance(before, self.spec_counters(client)) if speculating else None
        self.report["results"][model][index] = row
        self.save()

    @staticmethod
    def spec_counters(client: Client) -> dict[str, float]:
        """The server's speculative-decoding counters now. Read after a rate's last token, they hold
        its last step: the server records a step's stats before it streams that step's tokens."""
        counters = spec_decode_counters(metrics_text(client.base_url))
        if counters is None:
            raise RuntimeError(
                f"the server at {client.base_url} speculates but its /metrics page has no "
                "vllm:spec_decode_* counters (were its stats disabled?)"
            )
        return counters

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
