"""The online benchmark's report for people: the table `swiftkv bench --online` prints and the PNG of
latency against request rate (TTFT p99 and TPOT p50, both models on each panel). Where a server
speculates, its label names the speculator and the table gives its acceptance rate per rate."""

from __future__ import annotations

import json
import math
from pathlib import Path

from ..plots import figure
from ..results import OnlineResults
from ..vllm.speculative import resolve_method
from .online_metrics import ratio

NAMES = {"baseline": "baseline", "swiftkv": "SwiftKV"}


def number(value, scale: float = 1.0, digits: str = ".4g") -> str:
    return "n/a" if value is None or not math.isfinite(value) else format(value * scale, digits)


def side_label(model: str, speculative: dict | None) -> str:
    """'SwiftKV', or 'SwiftKV + ngram k=4' for a server that speculates."""
    if not speculative:
        return NAMES[model]
    tokens = speculative.get("num_speculative_tokens")
    return f"{NAMES[model]} + {resolve_method(speculative)}" + ("" if tokens is None else f" k={tokens}")


def speculative_of(report: OnlineResults, model: str) -> dict | None:
    return (report.speculative_config or {}).get(model)


def rate_rows(report: OnlineResults | dict) -> list[str]:
    report = OnlineResults.of(report)
    base, swift = report.results["baseline"], report.results["swiftkv"]
    rows = [
        f"{'rate':>9} | {'TTFT p99 (s)':^26} | {'TPOT p50 (ms)':^26} | {'goodput (req/s)':^17} | "
        f"{'output tok/s':^17}",
        f"{'req/s':>9} | {'base':>8}{'SwiftKV':>9}{'ratio':>9} | {'base':>8}{'SwiftKV':>9}{'ratio':>9} | "
        f"{'base':>8}{'SwiftKV':>9} | {'base':>8}{'SwiftKV':>9}",
    ]
    for rate, b, s in zip(report.rates, base, swift, strict=True):
        if b is None or s is None:
            continue
        cells = [
            number(rate),
            number(b.ttft_p99_s),
            number(s.ttft_p99_s),
            number(ratio(s.ttft_p99_s, b.ttft_p99_s), digits=".3f"),
            number(b.tpot_p50_s, 1e3),
            number(s.tpot_p50_s, 1e3),
            number(ratio(s.tpot_p50_s, b.tpot_p50_s), digits=".3f"),
            number(b.goodput),
            number(s.goodput),
            number(b.output_throughput),
            number(s.output_throughput),
        ]
        marks = ("" if b.meets_slo else "*", "" if s.meets_slo else "*")
        rows.append(
            f"{cells[0]:>9} | {cells[1] + marks[0]:>8}{cells[2] + marks[1]:>9}{cells[3]:>9} | "
            f"{cells[4]:>8}{cells[5]:>9}{cells[6]:>9} | {cells[7]:>8}{cells[8]:>9} | "
            f"{cells[9]:>8}{cells[10]:>9}"
        )
    return rows


def tail_rows(report: OnlineResults | dict) -> list[str]:
    """Per rate, the other percentiles (TTFT p50, TPOT p99) and each speculator's acceptance rate."""
    report = OnlineResults.of(report)
    base, swift = report.results["baseline"], report.results["swiftkv"]
    rows = [
        f"{'rate':>9} | {'TTFT p50 (s)':^17} | {'TPOT p99 (ms)':^17} | {'acceptance rate':^17}",
        f"{'req/s':>9} | {'base':>8}{'SwiftKV':>9} | {'base':>8}{'SwiftKV':>9} | {'base':>8}{'SwiftKV':>9}",
    ]
    for rate, b, s in zip(report.rates, base, swift, strict=True):
        if b is None or s is None:
            continue
        accepted = [number((row.speculative or {}).get("acceptance_rate"), digits=".3f") for row in (b, s)]
        rows.append(
            f"{number(rate):>9} | {number(b.ttft_p50_s):>8}{number(s.ttft_p50_s):>9} | "
            f"{number(b.tpot_p99_s, 1e3):>8}{number(s.tpot_p99_s, 1e3):>9} | {accepted[0]:>8}{accepted[1]:>9}"
        )
    return rows


def speculative_rows(report: OnlineResults) -> list[str]:
    """One line per server saying what it ran (its speculative config, or none)."""
    return [
        f"{NAMES[model]}: " + (f"--speculative-config '{json.dumps(config)}'" if config else "no speculation")
        for model in NAMES
        for config in [speculative_of(report, model)]
    ]


def summary_rows(report: OnlineResults | dict) -> list[str]:
    report = OnlineResults.of(report)
    summary, idle = report.summary, report.idle
    best, bound = summary.max_rate, summary.max_rate_is_lower_bound

    def rate_text(model: str) -> str:
        if best[model] is None:
            return "none of the rates tested"
        return f"{best[model]:.4g} req/s" + (" (the highest tested: a lower bound)" if bound[model] else "")

    saturation = summary.baseline_saturation_rate
    base_idle, swift_idle = idle["baseline"], idle["swiftkv"]
    return [
        f"SLO: {report.slo.how}   (* = p99 outside the SLO or a request failed)",
        f"idle TTFT: baseline {number(base_idle.ttft_s)} s, SwiftKV {number(swift_idle.ttft_s)} s "
        f"(ratio {number(ratio(swift_idle.ttft_s, base_idle.ttft_s), digits='.3f')})",
        f"highest rate within the SLO: baseline {rate_text('baseline')}, SwiftKV {rate_text('swiftkv')}",
        f"SwiftKV / baseline sustained rate: {number(summary.max_rate_ratio, digits='.3f')}",
        f"TPOT p50 ratio at the baseline's saturation rate ({number(saturation)} req/s): "
        f"{number(summary.tpot_p50_ratio_at_saturation, digits='.3f')}",
    ]


def format_table(report: OnlineResults | dict) -> str:
    report = OnlineResults.of(report)
    # Reports written before speculation was an option have no config to name.
    rows = (speculative_rows(report) + [""] if report.speculative_config else []) + rate_rows(report)
    rows += [""] + tail_rows(report)
    if report.summary:
        rows += [""] + summary_rows(report)
    return "\n".join(rows)


def plot(report: OnlineResults | dict, path: Path) -> None:
    """TTFT p99 (log scale: it grows without bound past saturation) and TPOT p50 against the request
    rate, both models on each panel, the SLO's TTFT bound dashed."""
    with figure(path, (11, 4.2), ncols=2, dpi=120) as (fig, (ttft_axis, tpot_axis)):
        draw_online(OnlineResults.of(report), fig, ttft_axis, tpot_axis)


def draw_online(report: OnlineResults, figure, ttft_axis, tpot_axis) -> None:
    for model, color in (("baseline", "tab:gray"), ("swiftkv", "tab:blue")):
        label = side_label(model, speculative_of(report, model)) + (" (vLLM)" if model == "baseline" else "")
        points = [(rate, row) for rate, row in zip(report.rates, report.results[model], strict=True) if row]
        rates = [rate for rate, _ in points]
        ttft_axis.plot(rates, [row.ttft_p99_s for _, row in points], "o-", color=color, label=label)
        tpot_axis.plot(rates, [row.tpot_p50_s * 1e3 for _, row in points], "o-", color=color, label=label)
    if report.slo:
        ttft_axis.axhline(report.slo.ttft_s, color="tab:red", linestyle="--", linewidth=1, label="SLO")
    ttft_axis.set_yscale("log")
    ttft_axis.set(xlabel="request rate (req/s)", ylabel="TTFT p99 (s)", title="time to first token, p99")
    tpot_axis.set(xlabel="request rate (req/s)", ylabel="TPOT p50 (ms)", title="time per output token, p50")
    for axis in (ttft_axis, tpot_axis):
        axis.grid(alpha=0.3)
        axis.legend()
    workload = report.workload
    prompts = (
        f"{workload.kind} <= {workload.prompt_len}" if workload.kind == "extractive" else workload.prompt_len
    )
    figure.suptitle(
        f"online: {Path(report.model).name} vs {Path(report.baseline_model).name}, "
        f"{prompts} in / {workload.output_len} out, Poisson arrivals"
    )
