"""`swiftkv eval SRC --sweep 25%,40%,50%`: convert SRC at several SwiftKV fractions (and AcrossKV
group sizes), evaluate each against SRC, and plot agreement with the teacher against the prefill
compute the student saves: the trade-off a user needs to choose N and G.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ..convert import ConvertSettings, convert
from ..files import atomic_file, write_atomic
from ..model.config import num_key_value_layers_for
from ..plots import figure
from ..results import EvalResults, StudentResult
from ..sources import Source, open_source, read_config_dict
from .report import write_report
from .run import evaluate_models
from .settings import EvalSettings, SweepSettings


def parse_fractions(text: str) -> list[float]:
    fractions = []
    for part in text.split(","):
        part = part.strip()
        try:
            value = float(part.rstrip("%")) / (100 if part.endswith("%") else 1)
        except ValueError:
            value = -1.0
        if not 0 < value < 1:
            raise ValueError(
                f"--sweep entry {part!r} is not a fraction in (0, 1); expected e.g. 25%,40%,50% or 0.5"
            )
        fractions.append(value)
    return fractions


def parse_group_sizes(text: str) -> list[int]:
    sizes = [part.strip() for part in text.split(",")]
    if not all(size.isdigit() and int(size) >= 1 for size in sizes):
        raise ValueError(f"--sweep-group-sizes {text!r} is not a list of positive integers (e.g. 1,2)")
    return [int(size) for size in sizes]


def sweep_points(num_layers: int, fractions: list[float], group_sizes: list[int]) -> list[tuple[int, int]]:
    """(N, G) for every fraction and group size that fits: G must divide the L - N later layers."""
    points = []
    for fraction in fractions:
        n = num_key_value_layers_for(num_layers, fraction)
        points += [(n, g) for g in group_sizes if (num_layers - n) % g == 0 and (n, g) not in points]
    if not points:
        raise ValueError(
            f"no sweep point fits a {num_layers}-layer model: each G must divide the later layers"
        )
    return points


def convert_points(source: Source, points: list[tuple[int, int]], folder: Path, init: str) -> list[Path]:
    """One SwiftKV folder per point, converted once and reused by later sweeps."""
    paths = []
    for n, g in points:
        path = folder / f"N{n}-G{g}-{init}"
        if not (path / "config.json").is_file():
            print(f"converting {source} at N={n}, G={g} ({init}) -> {path}", flush=True)
            convert(
                ConvertSettings(
                    source=source, out=path, num_key_value_layers=n, key_value_group_size=g, init=init
                )
            )
        paths.append(path)
    return paths


def run_sweep(settings: EvalSettings, sweep: SweepSettings) -> list[Path]:
    """Convert the source (`settings.students`' one entry) at every sweep point, evaluate each against
    it, write the report, the trade-off table and its plot into `settings.out`."""
    if len(settings.students) != 1:
        raise ValueError("--sweep takes exactly one MODEL: the source model to convert")
    source, out = open_source(settings.students[0], settings.revision), Path(settings.out)
    layers = read_config_dict(source.folder)["num_hidden_layers"]
    points = sweep_points(layers, parse_fractions(sweep.sweep), parse_group_sizes(sweep.sweep_group_sizes))
    students = convert_points(source, points, out / "models", sweep.sweep_init)
    settings.extra["sweep"] = {"points": points, "init": sweep.sweep_init}
    converted = tuple(map(str, students))  # folders: no revision
    results = evaluate_models(replace(settings, students=converted, revision=None, teacher=source))
    paths = write_report(results, out)
    with atomic_file(out / "sweep.png") as tmp:
        plot_tradeoff(results, tmp)
    write_atomic(out / "sweep.md", tradeoff_table(results))
    return [*paths, out / "sweep.png", out / "sweep.md"]


def quality(student: StudentResult | dict) -> dict[str, float]:
    """Agreement measures of one sweep point (mean task agreement over the evaluated tasks)."""
    student = StudentResult.of(student)
    tasks, forced = student.tasks, student.teacher_forced
    out = {}
    if tasks:
        out["task agreement (mean)"] = sum(t.paired["acc"].agreement for t in tasks.values()) / len(tasks)
    if forced and forced.tokens:
        out["chat top-1 agreement"] = forced.top1_agreement
    if student.generation:
        out["identical greedy answers"] = student.generation.identical_fraction
    return out


def tradeoff_table(results: EvalResults | dict) -> str:
    results = EvalResults.of(results)
    lines = [
        "# SwiftKV trade-off sweep",
        "",
        f"Teacher: `{results.teacher}`",
        "",
        "| N | G | prefill compute saved | " + " | ".join(quality(results.students[0])) + " |",
        "|---|---|---|" + "---|" * len(quality(results.students[0])),
    ]
    for student in results.students:
        info = student.pair
        values = " | ".join(f"{v:.3f}" for v in quality(student).values())
        lines.append(
            f"| {info.num_key_value_layers} | {info.key_value_group_size} | "
            f"{student.prefill_compute_saving:.1%} | {values} |"
        )
    return "\n".join(lines) + "\n"


def plot_tradeoff(results: EvalResults | dict, path: Path) -> None:
    with figure(path, (7, 4.5)) as (_, ax):
        draw_tradeoff(EvalResults.of(results), ax)


def draw_tradeoff(results: EvalResults, ax) -> None:
    students = results.students
    groups = sorted({s.pair.key_value_group_size for s in students})
    for g in groups:
        chosen = sorted(
            (s for s in students if s.pair.key_value_group_size == g), key=lambda s: s.prefill_compute_saving
        )
        for measure in quality(chosen[0]):
            xs = [100 * s.prefill_compute_saving for s in chosen]
            ax.plot(xs, [quality(s)[measure] for s in chosen], marker="o", label=f"{measure}, G={g}")
            for s, x in zip(chosen, xs, strict=True):
                ax.annotate(f"N={s.pair.num_key_value_layers}", (x, quality(s)[measure]), fontsize=7)
    ax.set_xlabel("prefill compute saved per prompt token (% of linear-layer FLOPs)")
    ax.set_ylabel("agreement with the teacher")
    ax.set_ylim(0, 1.02)
    ax.set_title(f"SwiftKV trade-off for {results.teacher}", fontsize=9)
    ax.legend(fontsize=7)
