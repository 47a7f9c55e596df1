"""The capacity table of study round 4 (study4.sh): one row per arm from its run folder's files.

    python docs/distill-study/capacity.py RUNS_FOLDER r13 c2 c1r64 > table.md   (JSON beside: --json FILE)

Per arm: trained parameters (from the checkpoint), held-out KL / top-1 at the end of the run, the
`--tasks none` eval (chat KL / top-1, greedy first divergence / identical answers, long prompts), the
knowledge eval (mean paired accuracy difference over the 5 tasks, in points, and how many tasks drop
at p < .01), training tok/s and the run's peak RSS (GNU time; the R13 run also generated the teacher
replies with vLLM, whose engine process counts in its peak).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import torch

FLOOR_KEYS = ("teacher_forced", "generation", "long_prompt")


def trained_parameters(runs: Path, arm: str) -> int:
    checkpoint = torch.load(runs / f"s4-{arm}.ckpt" / "checkpoint.pt", map_location="cpu", weights_only=False)
    return sum(t.numel() for t in checkpoint["trained"].values())


def peak_rss_mib(runs: Path, arm: str) -> float | None:
    text = (runs / f"time-s4-{arm}.txt").read_text() if (runs / f"time-s4-{arm}.txt").exists() else ""
    peaks = [int(k) for k in re.findall(r"Maximum resident set size \(kbytes\): (\d+)", text)]
    return round(max(peaks) / 1024, 1) if peaks else None


def knowledge(runs: Path, arm: str) -> dict | None:
    path = runs / f"know-s4-{arm}" / "results.json"
    if not path.exists():
        return None
    tasks = json.loads(path.read_text())["students"][0]["tasks"]
    diffs = {task: result["paired"]["acc"]["diff"] for task, result in tasks.items()}
    significant = [
        task
        for task, result in tasks.items()
        if result["paired"]["acc"]["diff"] < 0 and result["paired"]["acc"]["mcnemar_p"] < 0.01
    ]
    return {
        "mean_diff_points": 100 * sum(diffs.values()) / len(diffs),
        "diff_points": {t: 100 * d for t, d in diffs.items()},
        "drops_p01": significant,
        "items": {t: r["paired"]["acc"]["n"] for t, r in tasks.items()},
    }


def arm_row(runs: Path, arm: str) -> dict:
    distilled = json.loads((runs / f"s4-{arm}.json").read_text())
    row = {
        "arm": arm,
        "trainable": distilled["settings"]["trainable"],
        "lora_rank": distilled["settings"]["lora_rank"],
        "late_lr": distilled["settings"]["late_lr"],
        "trained_parameters": trained_parameters(runs, arm),
        "train_tokens": distilled["train_tokens"],
        "tokens_per_second": distilled["tokens_per_second"],
        "peak_rss_mib": peak_rss_mib(runs, arm),
        "heldout_after": distilled["heldout_after"],
    }
    evaluated = runs / f"eval-s4-{arm}" / "results.json"
    if evaluated.exists():
        results = json.loads(evaluated.read_text())
        row["eval"] = {key: results["students"][0].get(key) for key in FLOOR_KEYS}
        row["floor"] = {key: (results.get("floor") or {}).get(key) for key in FLOOR_KEYS}
    row["knowledge"] = knowledge(runs, arm)
    return row


def speed_rows(runs: Path, arms: list[str]) -> list[dict]:
    """`swiftkv distill n15-lstsq ARM-OPTIONS --speed 3` on a quiet machine (speed.sh): the arm's own
    trainable set, timed and sized alone."""
    rows = []
    for arm in arms:
        path = runs / f"speed-{arm}.json"
        if path.exists():
            result = json.loads(path.read_text())
            rows.append(
                {
                    "arm": arm,
                    "trainable": result["trainable"],
                    "trained_parameters": result["trained_parameters"],
                    "tokens_per_s": result["shared"]["tokens_per_s"],
                    "peak_memory_mib": result["peak_memory_mib"],
                    "fraction_of_bound": result["compute_bound"]["fraction_of_bound"],
                    "bound_tokens_per_s": result["compute_bound"]["bound_tokens_per_s"],
                    "matmul_peak_gflops": result["compute_bound"]["matmul_peak_flops"] / 1e9,
                    "dtype": result["dtype"],
                }
            )
    return rows


def speed_markdown(rows: list[dict]) -> str:
    lines = [
        "| arm | trainable | trained params | tok/s | bound tok/s | measured / bound | peak RSS (MiB) |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['arm']} | {row['trainable']} | {row['trained_parameters'] / 1e6:.2f}M | "
            f"{row['tokens_per_s']:.1f} | {row['bound_tokens_per_s']:.1f} | {row['fraction_of_bound']:.2f} | "
            f"{row['peak_memory_mib']:.0f} |"
        )
    return "\n".join(lines)


def cell(value, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def markdown(rows: list[dict]) -> str:
    header = [
        "arm",
        "trained params",
        "held-out top-1",
        "chat KL",
        "chat top-1",
        "first divergence",
        "identical",
        "long top-1",
        "long first div.",
        "knowledge Δ (points)",
        "drops p<.01",
        "tok/s",
        "peak RSS (MiB)",
    ]
    lines = ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    floor = next((r["floor"] for r in rows if r.get("floor") and r["floor"].get("teacher_forced")), None)
    for row in ([{"arm": "floor (teacher bf16 vs fp32)", "eval": floor}] if floor else []) + rows:
        forced, generated, long = ((row.get("eval") or {}).get(k) or {} for k in FLOOR_KEYS)
        known = row.get("knowledge") or {}
        lines.append(
            "| "
            + " | ".join(
                [
                    row["arm"],
                    f"{row['trained_parameters'] / 1e6:.2f}M" if "trained_parameters" in row else "–",
                    cell((row.get("heldout_after") or {}).get("top1")),
                    cell(forced.get("kl_mean")),
                    cell(forced.get("top1_agreement")),
                    cell(generated.get("mean_first_divergence"), 2),
                    cell(generated.get("identical_fraction")),
                    cell(long.get("top1_agreement")),
                    cell(long.get("mean_first_divergence"), 2),
                    cell(known.get("mean_diff_points"), 2),
                    str(len(known["drops_p01"])) if known else "–",
                    cell(row.get("tokens_per_second"), 1),
                    cell(row.get("peak_rss_mib"), 0),
                ]
            )
            + " |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path)
    parser.add_argument("arms", nargs="+")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = [arm_row(args.runs, arm) for arm in args.arms if (args.runs / f"s4-{arm}.json").exists()]
    speeds = speed_rows(args.runs, args.arms)
    print(markdown(rows))
    if speeds:
        print("\n" + speed_markdown(speeds))
    if args.json:
        args.json.write_text(json.dumps({"arms": rows, "speed": speeds}, indent=1) + "\n")


if __name__ == "__main__":
    main()
