"""A weight-space average ("model soup") of distilled students of one teacher and geometry.

    python scripts/study/distill/soup.py OUT STUDENT_FOLDER STUDENT_FOLDER [...] [--weights W,W,...] [--rank R]

Each STUDENT_FOLDER is a trained-tensor folder (`save_swiftkv_params`: swiftkv.json + swiftkv.safetensors) or
a student snapshot (`python -m loan run`'s n15/, n22/, scripts/gpu), which is read as one: installed over its teacher
(`swiftkv.distill.start.snapshot.install`) and its trained tensors saved at the loan's rank (`save_swiftkv_params`), in a temp folder.
The SwiftKV projections are averaged, each student's at its weight (`--weights`, normalized to sum to 1;
default: equal). A negative weight extrapolates: `--weights 3,-1` over a student and its own starting point
is the student moved on half as far again along what its last stage changed (the weights must have a positive
sum; a leading negative one is given as `--weights=-1,3`). Each adapted weight's difference from the base, delta_b @ delta_a, is averaged exactly: the
factors are stacked side by side (rank k x r) and each student's delta_a scaled by its weight, so the stored
product is the weighted mean of the students' differences. A weight that is a power of two (1/2, 1/4) scales
bf16 exactly; another costs one bf16 rounding of that delta_a. `--rank R` stores instead the best rank-R
approximation of each mean difference (its leading singular vectors; the share of the difference it leaves
out is printed), so the soup keeps its students' rank and format. Students trained from the same init on other
data or schedules (the shipped -swiftkv25 and the loan's N = 22) are the usual case for such an average.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

from swiftkv.distill import install, is_snapshot, read_progress, snapshot_teacher
from swiftkv.model.surgery import (
    DELTA_FACTORS,
    low_rank_factors,
    read_trained,
    save_swiftkv_params,
    stored_deltas,
    write_trained,
)
from swiftkv.sources import load_model

GEOMETRY = ("base", "num_key_value_layers", "key_value_group_size", "student_trained")


def soup(folders: list[Path], weights: list[float] | None = None) -> tuple[dict, dict[str, torch.Tensor]]:
    """(spec, tensors) of the mean of the students in `folders`, each at its share of `weights` (default: equal;
    a negative one extrapolates away from that student)."""
    weights = weights or [1.0] * len(folders)
    if len(weights) != len(folders) or 0.0 in weights or sum(weights) <= 0:
        raise ValueError(
            f"--weights {weights}: expected {len(folders)} nonzero weights, one per student, with a positive sum"
        )
    shares = [w / sum(weights) for w in weights]
    read = [read_student(folder) for folder in folders]
    specs, tensors = [spec for spec, _ in read], [t for _, t in read]
    for folder, spec, named in zip(folders[1:], specs[1:], tensors[1:], strict=True):
        differing = [k for k in GEOMETRY if spec.get(k) != specs[0].get(k)]
        if differing or set(named) != set(tensors[0]):
            raise ValueError(f"{folder} is another student than {folders[0]} ({differing or 'tensor names'})")
    dtype = next(iter(tensors[0].values())).dtype
    averaged = {}
    for name in tensors[0]:
        parts = [t[name].float() for t in tensors]
        if name.endswith(DELTA_FACTORS[0]):  # delta_b: [out, r] each -> [out, k r]
            averaged[name] = torch.cat(parts, dim=1).to(dtype)
        elif name.endswith(DELTA_FACTORS[1]):  # delta_a: [r, in] each, times its share -> [k r, in]
            averaged[name] = torch.cat([p * w for p, w in zip(parts, shares, strict=True)]).to(dtype)
        else:
            averaged[name] = sum(p * w for p, w in zip(parts, shares, strict=True)).to(dtype)
    spec = dict(specs[0])
    if "student_rank" in spec:
        spec["student_rank"] = sum(s["student_rank"] for s in specs)
    return spec, averaged


def read_student(folder: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """(spec, tensors) of a trained-tensor folder, or of a loan's snapshot saved as one (the module's doc)."""
    if not is_snapshot(folder):
        return read_trained(folder)
    progress = read_progress(folder)
    teacher = snapshot_teacher(progress, None)
    with tempfile.TemporaryDirectory() as tmp:
        installed = load_model(install(folder, Path(tmp) / "installed"))
        trained = Path(tmp) / "trained"
        save_swiftkv_params(
            installed,
            trained,
            base=teacher,
            base_model=load_model(teacher),
            student_rank=progress["lora_rank"],
        )
        return read_trained(trained)


def at_rank(spec: dict, tensors: dict[str, torch.Tensor], rank: int) -> dict[str, torch.Tensor]:
    """`tensors` with each difference delta_b @ delta_a replaced by its best rank-`rank` factors; `spec`'s
    student_rank set to `rank`. Prints the largest share of a difference's norm left out."""
    dtype, truncated, worst = next(iter(tensors.values())).dtype, dict(tensors), 0.0
    for name, delta in stored_deltas(tensors).items():
        factors, left = low_rank_factors(delta, rank)
        for suffix, factor in zip(DELTA_FACTORS, factors, strict=True):
            truncated[name + suffix] = factor.to(dtype)
        worst = max(worst, left)
    spec["student_rank"] = rank
    print(f"rank {rank}: at most {worst:.1%} of a difference's norm left out")
    return truncated


def left_out(folder: Path, students: list[Path], weights: list[float] | None = None) -> float:
    """The largest share of a mean change's norm that the factors stored in `folder` (`--rank`) leave out of the
    exact mean of `students` (bf16 rounding of the stored factors included): what a soup's card states."""
    exact = stored_deltas(soup(students, weights)[1])
    kept = stored_deltas(read_trained(folder)[1])
    return max((float((mean - kept[name]).norm() / mean.norm()) for name, mean in exact.items()), default=0.0)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description="the weight-space mean of distilled students")
    parser.add_argument("out", help="the soup's trained-tensor folder")
    parser.add_argument(
        "students",
        nargs="+",
        help="two or more students of one teacher and N: trained-tensor folders or loan snapshots",
    )
    parser.add_argument(
        "--weights",
        help="one weight per student, comma-separated (default: equal; a negative one extrapolates)",
    )
    parser.add_argument("--rank", type=int, help="store each mean change as its best rank-R factors")
    args = parser.parse_args(argv)
    if len(args.students) < 2:
        parser.error("expected two or more students")
    weights = [float(w) for w in args.weights.split(",")] if args.weights else None
    spec, tensors = soup([Path(s) for s in args.students], weights)
    if args.rank is not None:
        tensors = at_rank(spec, tensors, args.rank)
    folder = write_trained(Path(args.out), spec, tensors)
    print(f"wrote {folder}: the mean of {', '.join(args.students)} (student_rank {spec.get('student_rank')})")


if __name__ == "__main__":
    main(sys.argv[1:])
