#!/bin/bash
# Issue 32's students on a lent GPU box (torch 2.11 + cu130, Python 3.12, transformers, no network): the
# stage travels in two parts, then `swiftkv loan run` writes the teacher's replies, measures the trainer on
# a Llama-3.1-8B shape and trains both students in parallel, with every result under $OUT as it comes.
#
#   bash docs/distill-study/gpu_students.sh stage   # here: .devdata/sk/part1 and part2 (swiftkv loan stage)
#   swiftkv loan stash                               # what the box never reads out of the tree (unstash after)
#   then two calls of the device tool from the repository root, the second at once (the box keeps /root/sk
#   only while it is warm, 30 s after a call):
#     carry [".devdata/sk/part1"]: bash docs/distill-study/gpu_students.sh unpack1
#     carry [".devdata/sk/part2"], timeout_s 600: bash docs/distill-study/gpu_students.sh run
#   then, here: swiftkv loan install <files_at>/n15 --out ... (and n22), and unstash.
# A later loan continues what an earlier one brought back (its n15/, n22/, replies.npz.xz and compiled.tar;
# 49-61 MiB, too much to ride beside part 2, so it takes a call of its own between the two):
#   bash docs/distill-study/gpu_students.sh previous <that loan's output>   # here: .devdata/sk/previous
#     carry [".devdata/sk/part1"]:     bash docs/distill-study/gpu_students.sh unpack1
#     carry [".devdata/sk/previous"]:  bash docs/distill-study/gpu_students.sh unpack-previous
#     carry [".devdata/sk/part2"]:     RESUME=1 ARGS="--shape none" bash docs/distill-study/gpu_students.sh run
#   DRY=1 STAGE=... OUT=... bash docs/distill-study/gpu_students.sh run   # the run stage on this CPU (the suite)
set -uo pipefail
stage=$1
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
W=${W:-/root/sk}
OUT=${OUT:-$W/out}

need() {  # the file a stage needs, or one error naming the stage that writes it
  [ -f "$1" ] || { echo "gpu_students.sh: $1 is missing; it is written by '$2'" >&2; exit 2; }
}

case $stage in
  stage)
    # The every-turn replies this CPU wrote ahead (`every.sh`, a superset of the 8M-token student's) travel
    # too: the loan writes only the rest.
    "$ROOT/.venv/bin/python" -m swiftkv.cli loan stage smollm2-135m-instruct --out "$ROOT/.devdata/sk" \
      --replies "$ROOT/docs/distill-study/replies-every-ids.jsonl.xz" ${ARGS:-} ;;
  previous)
    # What a resumed loan reads of an earlier one's output ($2), and nothing else: the students' snapshots,
    # the replies and, where that loan compiled its layers, their compiled artifacts (compiled.tar).
    need "${2:-}/replies.npz.xz" "a loan: name its output folder, e.g. docs/distill-study/loan-h200-2026-11-27"
    rm -rf "$ROOT/.devdata/sk/previous" && mkdir -p "$ROOT/.devdata/sk/previous" \
      && cp -r "$2"/n[0-9]* "$2/replies.npz.xz" "$ROOT/.devdata/sk/previous/" \
      && { [ ! -f "$2/compiled.tar" ] || cp "$2/compiled.tar" "$ROOT/.devdata/sk/previous/"; } ;;
  unpack1)
    need .devdata/sk/part1/teacher.tar.0 "gpu_students.sh stage (carried by the first call)"
    mkdir -p "$W" && rm -rf "$W/part1" && cp -r .devdata/sk/part1 "$W/"
    python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__, torch.cuda.get_device_name(0))" ;;
  unpack-previous)
    need .devdata/sk/previous/replies.npz.xz "gpu_students.sh previous (carried by its own call)"
    mkdir -p "$W" && rm -rf "$W/previous" && cp -r .devdata/sk/previous "$W/" ;;
  run)
    mkdir -p "$OUT"
    if [ -n "${DRY:-}" ]; then  # this CPU, the repository's venv, a staged tiny teacher (tests/test_loan.py)
      PYTHONPATH=$ROOT/src TQDM_DISABLE=1 "$ROOT/.venv/bin/python" -m swiftkv.cli loan run "$STAGE" --out "$OUT" --device cpu ${ARGS:-} \
        2>&1 | tee "$OUT/loan.log"
      exit "${PIPESTATUS[0]}"
    fi
    need .devdata/sk/part2/stage.json "gpu_students.sh stage (carried by the second call)"
    need "$W/part1/teacher.tar.0" "gpu_students.sh unpack1 (the first call, at most 30 s before this one)"
    rm -rf "$W/part2" "$W/site" && cp -r .devdata/sk/part2 "$W/"
    # The gguf package the box lacks, on the path before Python starts (transformers checks for it once).
    mkdir -p "$W/site" && tar -C "$W/site" -xJf "$W/part2/site.tar.xz"
    # No progress bars: a bar's carriage returns would glue the next printed line onto it in the log.
    export PYTHONPATH=$W/site:$ROOT/src HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false \
      TQDM_DISABLE=1 HF_HUB_DISABLE_PROGRESS_BARS=1
    [ -z "${RESUME:-}" ] || need "$W/previous/replies.npz.xz" "gpu_students.sh unpack-previous (the call before this one)"
    resume=${RESUME:+--resume $W/previous}
    # shellcheck disable=SC2086
    python3 -m swiftkv.cli loan run "$W" --out "$OUT" --minutes "${MINUTES:-9}" $resume ${ARGS:-} 2>&1 | tee "$OUT/loan.log"
    exit "${PIPESTATUS[0]}" ;;
  *) echo "gpu_students.sh: unknown stage $stage (stage, previous, unpack1, unpack-previous, run)" >&2; exit 2 ;;
esac
