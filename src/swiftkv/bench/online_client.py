"""The online benchmark's client: vLLM's own serving benchmark, `vllm.benchmarks.serve.benchmark` (what
`vllm bench serve` runs), against one of our servers with our prompts.

Every call sends our token-id prompts as vLLM `SampleRequest`s to /v1/completions, streamed, with
`output_len` tokens, ignore_eos and temperature 0, and asks for the mean, p50 and p99 of TTFT, TPOT,
ITL and E2EL (`online_metrics.rate_row` reads them). A rate's call sends them at `rate` requests/s
with burstiness 1.0 (a Poisson process) and no concurrency limit, with the SLO as vLLM's goodput
config; the warm-up and idle requests are the same call one at a time (max_concurrency 1, all due at
once). vLLM draws the gaps from numpy's global RNG and rescales them so that the last request goes out
at num_requests / rate; `seed_arrivals` seeds that RNG (and `random`) from (--seed, rate index) just
before the call, so both models get the same schedule at a rate.

Speculative decoding: vLLM's benchmark reads the server's `vllm:spec_decode_*` counters on /metrics
before and after the requests and returns their difference (`spec_decode_*` keys, left out when
nothing was drafted); `spec_counters_exposed` checks once per server that it has them, so a rate
without those keys means no drafts, not a server that hides its counters.

vLLM is imported only after the plugin's version check (`swiftkv.vllm.versions`), so an unsupported
vLLM is our one error, and `benchmark` is called by keyword after `check_signature` has compared its
parameters with ours (from vLLM 0.32), so a changed signature is an error naming the parameter.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import random
import sys
from dataclasses import dataclass

import numpy as np

from ..vllm.versions import check_installed_vllm, installed_vllm_version
from .online_metrics import PERCENTILES, SLO, TIMES


@dataclass(frozen=True)
class Target:
    """One running server and what its requests ask for."""

    base_url: str
    served_name: str
    # Counts the output tokens of a server that sends no usage; vLLM reports no TTFT/TPOT/ITL without one.
    tokenizer: object
    output_len: int


def vllm_serve():
    """`vllm.benchmarks.serve`, imported once the installed vLLM has passed the plugin's check."""
    check_installed_vllm()
    from vllm.benchmarks import serve

    return serve


def check_signature(benchmark, arguments: dict) -> None:
    """Refuse a `benchmark` that lacks a parameter we pass, or requires one we do not, naming it."""
    parameters = inspect.signature(benchmark).parameters
    unknown = [name for name in arguments if name not in parameters]
    required = [
        name
        for name, parameter in parameters.items()
        if parameter.default is inspect.Parameter.empty
        and parameter.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
        and name not in arguments
    ]
    problems = [f"has no parameter {name!r}" for name in unknown]
    problems += [f"requires the parameter {name!r}, which swiftkv does not pass" for name in required]
    if problems:
        raise RuntimeError(
            f"vllm.benchmarks.serve.benchmark of vLLM {installed_vllm_version()} {' and '.join(problems)}; "
            "`swiftkv bench --online` calls it as vLLM 0.32 defines it"
        )


def seed_arrivals(seed: int, rate_index: int) -> None:
    """Seed the generators vLLM's arrival schedule draws from (numpy's global one; `random` too)."""
    state = int(np.random.SeedSequence([seed, rate_index]).generate_state(1)[0])
    np.random.seed(state)
    random.seed(state)


def benchmark_arguments(
    serve,
    target: Target,
    prompts: list[list[int]],
    rate: float,
    max_concurrency: int | None,
    slo: SLO | None,
    progress: bool,
) -> dict:
    """`benchmark`'s keyword arguments (every one it takes in vLLM 0.32 without a default, and the
    ready check's timeout)."""
    from vllm.benchmarks.datasets import SampleRequest

    # No TaskType where `benchmark` has no task_type parameter; check_signature then says so.
    task_type = getattr(serve, "TaskType", None)
    return {
        "task_type": task_type and task_type.GENERATION,
        "endpoint_type": "openai",  # /v1/completions, which takes token ids
        "api_url": target.base_url + "/v1/completions",
        "base_url": target.base_url,
        "model_id": target.served_name,
        "model_name": target.served_name,
        "tokenizer": target.tokenizer,
        "input_requests": [
            SampleRequest(prompt=ids, prompt_len=len(ids), expected_output_len=target.output_len)
            for ids in prompts
        ],
        "logprobs": None,
        "request_rate": rate,
        "burstiness": 1.0,
        "disable_tqdm": not progress,
        "num_warmups": 0,  # our warm-up is a call of its own
        "profile": False,
        "selected_percentile_metrics": list(TIMES.values()),
        "selected_percentiles": [float(q) for q in PERCENTILES],
        "ignore_eos": True,
        "goodput_config_dict": slo.goodput_config() if slo else {},
        "max_concurrency": max_concurrency,
        "lora_modules": None,
        "extra_headers": None,
        "extra_body": {"temperature": 0.0},
        # The server answered /health and the warm-up already; vLLM's ready check would send one more
        # request, unmeasured, before every rate.
        "ready_check_timeout_sec": 0,
    }


def run(
    target: Target,
    prompts: list[list[int]],
    rate: float = float("inf"),
    *,
    max_concurrency: int | None = None,
    slo: SLO | None = None,
    seed: tuple[int, int] | None = None,
    progress: bool = False,
) -> dict:
    """vLLM's benchmark of `prompts` against `target`: its result dict (times in ms, per-request lists).
    `seed` = (seed, rate index) fixes the arrival schedule."""
    serve = vllm_serve()
    arguments = benchmark_arguments(serve, target, prompts, rate, max_concurrency, slo, progress)
    check_signature(serve.benchmark, arguments)
    if seed is not None:
        seed_arrivals(*seed)
    # vLLM prints its report to stdout; `swiftkv bench` keeps stdout for its own table.
    with contextlib.redirect_stdout(sys.stderr):
        return asyncio.run(serve.benchmark(**arguments))


def spec_counters_exposed(base_url: str) -> bool:
    """Whether the server's /metrics page has the speculative-decoding counters vLLM's benchmark reads."""
    fetch_counters = getattr(vllm_serve(), "fetch_spec_decode_metrics", None)
    if fetch_counters is None:
        raise RuntimeError(
            f"the benchmark client of vLLM {installed_vllm_version()} reads no speculative-decoding "
            "counters (no vllm.benchmarks.serve.fetch_spec_decode_metrics), so it reports no acceptance rate"
        )

    async def fetch():
        import aiohttp

        async with aiohttp.ClientSession() as session:
            return await fetch_counters(base_url, session)

    return asyncio.run(fetch()) is not None
