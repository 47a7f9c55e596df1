"""Metrics of the online benchmark (`swiftkv bench --online`), pure functions without vLLM: our rows
from vLLM's benchmark results, the SLO and which rates meet it, and the comparison of the two models.

vLLM's `benchmark` (`online_client`) measures; its definitions, per model and rate:
  TTFT     time from sending a request to its first streamed token
  ITL      time between consecutive streamed chunks of one request, pooled over all requests
  TPOT     per request: (latency - TTFT) / (output tokens - 1), the mean decode time of one token
  latency  vLLM's E2EL, send to last token
  goodput  requests per second that met the SLO individually (TTFT and TPOT within it), vLLM's
           `request_goodput` with the SLO as its goodput config
  acceptance rate  with a speculator: accepted draft tokens / proposed draft tokens over one rate's
           requests, from the server's counters, which vLLM's benchmark reads before and after
`rate_row` turns its result (times in ms) into our row (seconds). Ours on top: a request that did not
make exactly `output_len` tokens counts as failed (ignore_eos makes the count exact), and a rate is
*sustained* when its p99 TTFT and p99 TPOT are within the SLO and no request failed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

MODELS = ("baseline", "swiftkv")
# Our row's name of each of vLLM's timed metrics (`latency` is vLLM's E2EL).
TIMES = {"ttft": "ttft", "tpot": "tpot", "itl": "itl", "latency": "e2el"}
PERCENTILES = (50, 99)


@dataclass(frozen=True)
class SLO:
    """Service-level objective: p99 TTFT and p99 TPOT bounds in seconds (also applied per request
    for goodput), and how they were chosen."""

    ttft_s: float
    tpot_s: float
    how: str = ""

    def goodput_config(self) -> dict[str, float]:
        """vLLM's goodput config of this SLO: the per-request bounds in milliseconds."""
        return {"ttft": self.ttft_s * 1e3, "tpot": self.tpot_s * 1e3}


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


def meets_slo(row: dict, slo: SLO) -> bool:
    return bool(row["failed"] == 0 and row["ttft_p99_s"] <= slo.ttft_s and row["tpot_p99_s"] <= slo.tpot_s)


def max_sustained_rate(rates: Sequence[float], meets: Sequence[bool]) -> float | None:
    """The highest rate such that it and every lower rate met the SLO (a pass above a failure is
    noise, not capacity); None when the lowest rate already fails."""
    best = None
    for rate, ok in sorted(zip(rates, meets, strict=True)):
        if not ok:
            break
        best = rate
    return best


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


# --------------------------------------------------------------------------------------------------
# vLLM's benchmark result -> our rows
# --------------------------------------------------------------------------------------------------


def request_errors(result: dict, output_len: int) -> list[str]:
    """Why each request that did not make exactly `output_len` tokens failed: vLLM's error, or the
    count it made (vLLM's `output_lens` is 0 for a request it counts as failed)."""
    return [
        error[-1000:] or f"made {made} tokens, expected {output_len}"
        for made, error in zip(result["output_lens"], result["errors"], strict=True)
        if made != output_len
    ]


def latencies(result: dict) -> dict[str, float]:
    """vLLM's means and percentiles of TTFT, TPOT, ITL and latency, in seconds (Python floats: vLLM's
    are numpy's, whose comparisons give numpy bools that JSON cannot write); NaN when no request
    succeeded (vLLM then reports 0 ms, which would read as an instant answer)."""
    done = result["completed"] > 0
    return {
        f"{ours}_{stat}_s": float(result[f"{stat}_{theirs}_ms"]) / 1e3 if done else math.nan
        for ours, theirs in TIMES.items()
        for stat in ("mean", *(f"p{q}" for q in PERCENTILES))
    }


def rate_row(result: dict, rate: float, output_len: int, slo: SLO, speculating: bool) -> dict:
    """One model at one rate, from vLLM's result. Throughputs and goodput are vLLM's (over its
    duration: from the start of its schedule to the last answer); a request of the wrong length,
    which vLLM counts as a success, is failed here, and a failure fails the SLO."""
    failures = request_errors(result, output_len)
    row = {
        "rate": rate,
        "completed": len(result["output_lens"]) - len(failures),
        "failed": len(failures),
        "duration_s": result["duration"],
        "request_throughput": result["request_throughput"],
        "output_throughput": result["output_throughput"],
        "total_token_throughput": result["total_token_throughput"],
        "goodput": result["request_goodput"],
        **latencies(result),
    }
    row["meets_slo"] = meets_slo(row, slo)
    row["errors"] = sorted(set(failures))[:3]
    row["speculative"] = speculative_stats(result) if speculating else None
    return row


def idle_latency(result: dict, output_len: int) -> dict:
    """vLLM's medians of the sequential requests on an idle server. They set the default rates and
    the SLO, so every one of them must have made `output_len` tokens."""
    if failures := request_errors(result, output_len):
        raise RuntimeError(f"a request to the idle server failed: {'; '.join(sorted(set(failures)))[-2000:]}")
    return {
        "ttft_s": float(result["median_ttft_ms"]) / 1e3,
        "tpot_s": float(result["median_tpot_ms"]) / 1e3,
        "latency_s": float(result["median_e2el_ms"]) / 1e3,
        "requests": result["completed"],
    }


def speculative_stats(result: dict) -> dict:
    """What a speculating server drafted over the rate, from vLLM's `spec_decode_*` result keys (the
    difference of its /metrics counters before and after the rate). vLLM leaves them out when nothing
    was drafted, and gives the acceptance rate in percent (ours: a fraction)."""
    if "spec_decode_draft_tokens" not in result:
        return {
            "drafts": 0,
            "draft_tokens": 0,
            "accepted_tokens": 0,
            "acceptance_rate": None,
            "mean_acceptance_length": None,
            "per_position_acceptance_rates": [],
        }
    drafts = result["spec_decode_num_drafts"]
    return {
        "drafts": drafts,
        "draft_tokens": result["spec_decode_draft_tokens"],
        "accepted_tokens": result["spec_decode_accepted_tokens"],
        "acceptance_rate": result["spec_decode_acceptance_rate"] / 100,
        # 1 + accepted / drafts: tokens per verify step per request, the bonus token included
        "mean_acceptance_length": result["spec_decode_acceptance_length"] if drafts else None,
        "per_position_acceptance_rates": result.get("spec_decode_per_position_acceptance_rates", []),
    }
