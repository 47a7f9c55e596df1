"""Metrics of the online benchmark (`swiftkv bench --online`), pure functions without vLLM: per-request
timings, their percentiles per request rate, goodput, the SLO and which rates meet it, the Poisson
arrival schedule, and the comparison of the two models.

Definitions (the same as vLLM's serving benchmark):
  TTFT     time from sending a request to its first streamed token
  ITL      time between consecutive streamed chunks of one request, pooled over all requests
  TPOT     per request: (latency - TTFT) / (output tokens - 1), the mean decode time of one token
  goodput  requests per second that met the per-request SLO (TTFT <= SLO and TPOT <= SLO)
  acceptance rate  with a speculator: accepted draft tokens / proposed draft tokens over one rate's
           requests, from the server's own counters (`spec_decode_counters`, read before and after)
A rate is *sustained* when its p99 TTFT and p99 TPOT are within the SLO and no request failed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

MODELS = ("baseline", "swiftkv")


@dataclass
class RequestResult:
    """One request as the client saw it; times in seconds."""

    ttft: float = math.nan
    latency: float = math.nan  # send to last token
    itl: list[float] = field(default_factory=list)
    output_tokens: int = 0
    prompt_tokens: int = 0
    success: bool = False
    error: str = ""

    @classmethod
    def from_token_times(
        cls, sent: float, token_times: Sequence[float], prompt_tokens: int = 0
    ) -> RequestResult:
        """A request whose tokens arrived one per chunk at `token_times` (absolute clock)."""
        if not token_times:
            return cls(prompt_tokens=prompt_tokens, error="no token arrived")
        return cls(
            ttft=token_times[0] - sent,
            latency=token_times[-1] - sent,
            itl=[b - a for a, b in zip(token_times, token_times[1:], strict=False)],
            output_tokens=len(token_times),
            prompt_tokens=prompt_tokens,
            success=True,
        )

    @property
    def tpot(self) -> float:
        """Mean time per output token after the first; NaN with fewer than two tokens."""
        if not self.success or self.output_tokens < 2:
            return math.nan
        return (self.latency - self.ttft) / (self.output_tokens - 1)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (linear interpolation, numpy's default); NaN for no values."""
    finite = [v for v in values if math.isfinite(v)]
    return float(np.percentile(finite, q)) if finite else math.nan


@dataclass(frozen=True)
class SLO:
    """Service-level objective: p99 TTFT and p99 TPOT bounds in seconds (also applied per request
    for goodput), and how they were chosen."""

    ttft_s: float
    tpot_s: float
    how: str = ""

    def met_by(self, request: RequestResult) -> bool:
        return request.success and request.ttft <= self.ttft_s and request.tpot <= self.tpot_s


def choose_slo(
    idle_ttft: float, idle_tpot: float, ttft_s: float, ttft_factor: float, tpot_s: float, tpot_factor: float
) -> SLO:
    """An explicit bound (> 0) wins; otherwise factor x the idle baseline's value: the SLO says how much
    slower than an idle server a loaded one may answer, which carries over between CPU and GPU."""
    ttft = ttft_s if ttft_s > 0 else ttft_factor * idle_ttft
    tpot = tpot_s if tpot_s > 0 else tpot_factor * idle_tpot
    ttft_how = (
        f"{ttft_s:g} s (given)" if ttft_s > 0 else f"{ttft_factor:g} x baseline idle TTFT {idle_ttft:.4g} s"
    )
    tpot_how = (
        f"{tpot_s:g} s (given)" if tpot_s > 0 else f"{tpot_factor:g} x baseline idle TPOT {idle_tpot:.4g} s"
    )
    return SLO(ttft, tpot, f"p99 TTFT <= {ttft:.4g} s ({ttft_how}); p99 TPOT <= {tpot:.4g} s ({tpot_how})")


def summarize(results: Sequence[RequestResult], duration: float, slo: SLO) -> dict:
    """The metrics of one model at one rate: `duration` runs from the first request sent to the last
    token received."""
    done = [r for r in results if r.success]
    ttfts, tpots = [r.ttft for r in done], [r.tpot for r in done]
    itls = [gap for r in done for gap in r.itl]
    latencies = [r.latency for r in done]
    output_tokens = sum(r.output_tokens for r in done)
    row = {
        "completed": len(done),
        "failed": len(results) - len(done),
        "duration_s": duration,
        "request_throughput": len(done) / duration,
        "output_throughput": output_tokens / duration,
        "total_token_throughput": (output_tokens + sum(r.prompt_tokens for r in done)) / duration,
        "goodput": sum(slo.met_by(r) for r in results) / duration,
    }
    for name, values in (("ttft", ttfts), ("tpot", tpots), ("itl", itls), ("latency", latencies)):
        row[f"{name}_mean_s"] = float(np.mean(values)) if values else math.nan
        for q in (50, 99):
            row[f"{name}_p{q}_s"] = percentile(values, q)
    row["meets_slo"] = meets_slo(row, slo)
    return row


def meets_slo(row: dict, slo: SLO) -> bool:
    return row["failed"] == 0 and row["ttft_p99_s"] <= slo.ttft_s and row["tpot_p99_s"] <= slo.tpot_s


def max_sustained_rate(rates: Sequence[float], meets: Sequence[bool]) -> float | None:
    """The highest rate such that it and every lower rate met the SLO (a pass above a failure is
    noise, not capacity); None when the lowest rate already fails."""
    best = None
    for rate, ok in sorted(zip(rates, meets, strict=True)):
        if not ok:
            break
        best = rate
    return best


def poisson_arrivals(rate: float, count: int, seed: int | Sequence[int]) -> list[float]:
    """Send times (seconds from the start) of `count` requests arriving as a Poisson process of
    `rate` requests/s: exponential gaps of mean 1/rate, the first request at 0. Seeded, so both
    models get the same schedule at a rate."""
    if rate <= 0:
        raise ValueError(f"request rate {rate} must be positive")
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, size=max(count - 1, 0))
    return [0.0, *np.cumsum(gaps).tolist()][:count]


def default_rates(idle_ttft: float, multipliers: Sequence[float]) -> list[float]:
    """Rates as multiples of the baseline's prefill-bound capacity 1 / idle TTFT: a server that did
    nothing but prefill these prompts one at a time would saturate there. Decode work lowers the real
    saturation point, and SwiftKV's faster prefill raises its own, so the multiples span both."""
    return sorted(m / idle_ttft for m in multipliers)


def ratio(new: float | None, old: float | None) -> float | None:
    if new is None or old is None or not math.isfinite(new) or not math.isfinite(old) or old == 0:
        return None
    return new / old


def compare(rates: Sequence[float], baseline: Sequence[dict], swiftkv: Sequence[dict]) -> dict:
    """The headline numbers: the highest rate each model sustains within the SLO and their ratio, the
    TPOT p50 ratio at the baseline's saturation rate (its highest sustained rate), and per rate the
    p99 TTFT of both models."""
    best = {
        name: max_sustained_rate(rates, [row["meets_slo"] for row in rows])
        for name, rows in zip(MODELS, (baseline, swiftkv), strict=True)
    }
    saturation = best["baseline"]
    at = rates.index(saturation) if saturation is not None else None
    return {
        "max_rate": best,
        # Met at the highest rate tested: the model may sustain more; the ratio is then a bound.
        "max_rate_is_lower_bound": {name: rate == max(rates) for name, rate in best.items()},
        "max_rate_ratio": ratio(best["swiftkv"], best["baseline"]),
        "baseline_saturation_rate": saturation,
        "tpot_p50_ratio_at_saturation": None
        if at is None
        else ratio(swiftkv[at]["tpot_p50_s"], baseline[at]["tpot_p50_s"]),
        "per_rate": [
            {
                "rate": rate,
                "ttft_p99_s": {"baseline": b["ttft_p99_s"], "swiftkv": s["ttft_p99_s"]},
                "ttft_p99_ratio": ratio(s["ttft_p99_s"], b["ttft_p99_s"]),
                "tpot_p50_ratio": ratio(s["tpot_p50_s"], b["tpot_p50_s"]),
                "goodput": {"baseline": b["goodput"], "swiftkv": s["goodput"]},
                "acceptance_rate": {"baseline": acceptance_rate(b), "swiftkv": acceptance_rate(s)},
            }
            for rate, b, s in zip(rates, baseline, swiftkv, strict=True)
        ],
    }


def acceptance_rate(row: dict) -> float | None:
    """A rate row's speculative acceptance rate (None: no speculator, or it drafted nothing)."""
    return (row.get("speculative") or {}).get("acceptance_rate")


def idle_summary(results: Sequence[RequestResult]) -> dict:
    """Medians of sequential requests on an idle server (no queueing, no batching)."""
    done = [r for r in results if r.success]
    if not done:
        raise RuntimeError(
            "no request to the idle server succeeded: " + "; ".join(r.error for r in results)[-2000:]
        )
    return {
        "ttft_s": float(np.median([r.ttft for r in done])),
        "tpot_s": float(np.median([r.tpot for r in done])),
        "latency_s": float(np.median([r.latency for r in done])),
        "requests": len(done),
    }


# vLLM 0.32's speculative-decoding counters (v1/spec_decode/metrics.py, SpecDecodingProm), as the
# server's /metrics endpoint names their families (the exposition adds `_total` to each sample).
SPEC_DECODE_COUNTERS = {
    "drafts": "vllm:spec_decode_num_drafts",
    "draft_tokens": "vllm:spec_decode_num_draft_tokens",
    "accepted_tokens": "vllm:spec_decode_num_accepted_tokens",
}


def spec_decode_counters(prometheus_text: str) -> dict[str, float] | None:
    """The speculative-decoding counters in a /metrics page (Prometheus text format), summed over
    their label sets (one per engine); None when the server does not speculate (no such family)."""
    from prometheus_client.parser import text_string_to_metric_families

    wanted = {family: key for key, family in SPEC_DECODE_COUNTERS.items()}
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(prometheus_text):
        if family.name in wanted:
            found[wanted[family.name]] = sum(
                s.value for s in family.samples if s.name == family.name + "_total"
            )
    return found if len(found) == len(SPEC_DECODE_COUNTERS) else None


def acceptance(before: dict[str, float] | None, after: dict[str, float] | None) -> dict | None:
    """What the speculator did between two readings of the counters: drafts, draft and accepted tokens,
    the acceptance rate (accepted / draft tokens) and the mean acceptance length (tokens per verify
    step per request, the bonus token included, as vLLM defines it); None without a speculator."""
    if before is None or after is None:
        return None
    delta = {key: after[key] - before[key] for key in SPEC_DECODE_COUNTERS}
    return {
        **delta,
        "acceptance_rate": delta["accepted_tokens"] / delta["draft_tokens"]
        if delta["draft_tokens"]
        else None,
        "mean_acceptance_length": 1 + delta["accepted_tokens"] / delta["drafts"] if delta["drafts"] else None,
    }
