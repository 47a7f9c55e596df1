#!/bin/bash
# Two SwiftKV students of SmolLM2-135M-Instruct (N = 15 and 22, recipe swiftkv-lora) trained on one GPU
# that has torch and transformers but no network: `python -m loan` (this folder) stages the teacher and
# the data here, then on the GPU writes the teacher's replies, measures the trainer on a Llama-3.1-8B shape
# and trains both students in parallel, every result under $OUT as soon as it exists (loan.json, loan.log,
# replies.npz.xz, n15/ and n22/ snapshots, compiled.tar). It exits 3 when an import it needs fails (before
# anything runs), 1 when a student or the shape fails, 4 when $OUT breaks outputs.py's limits (at most 8
# files of 16 MiB, two folders deep), 2 when a file a step needs is missing (naming the step that writes it).
#
# Steps, each run from the repository root:
#   bash scripts/gpu/gpu_students.sh stage            # here: .devdata/sk/part1 and part2 (each one upload)
#   bash scripts/gpu/gpu_students.sh unpack1          # on the GPU, with part 1: keeps it in $W
#   bash scripts/gpu/gpu_students.sh run              # on the GPU, with part 2: the run itself ($MINUTES, 9)
#   cd scripts/gpu && python -m loan install OUT/n15 --out STUDENT   # here again: a distilled HF folder
# A later run continues what an earlier one brought back (its n*/ snapshots, replies.npz.xz, compiled.tar):
#   bash scripts/gpu/gpu_students.sh previous EARLIER_OUT   # here: .devdata/sk/previous
#   bash scripts/gpu/gpu_students.sh unpack-previous        # on the GPU, with that folder: keeps it in $W
#   RESUME=1 ARGS="--shape none" bash scripts/gpu/gpu_students.sh run
# The CPU dry-run (tests/test_gpu_loan.py): DRY=1 STAGE=... OUT=... PYTHON=... bash scripts/gpu/gpu_students.sh run
set -uo pipefail
stage=$1
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
W=${W:-${TMPDIR:-/tmp}/swiftkv-gpu-students}  # the GPU machine's work folder, outside the checkout
OUT=${OUT:-$W/out}
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
# The every-turn replies a CPU wrote ahead: the run writes only the rest. They left the tree (docs/artifacts.json):
# the stage restores them from history when they are not there.
STUDY_REPLIES=docs/distill-study/replies-every-ids.jsonl.xz
REPLIES=${REPLIES:-$ROOT/$STUDY_REPLIES}

need() {  # the file a step needs, or one error naming the step that writes it
  [ -f "$1" ] || { echo "gpu_students.sh: $1 is missing; it is written by '$2'" >&2; exit 2; }
}

loan() {  # python -m loan, from this folder, with the checkout's swiftkv first on the path
  (cd "$HERE" && PYTHONPATH=$HERE:$ROOT/src${SITE:+:$SITE}${PYTHONPATH:+:$PYTHONPATH} "$@")
}

case $stage in
  stage)
    if [ "$REPLIES" = "$ROOT/$STUDY_REPLIES" ] && [ ! -f "$REPLIES" ]; then
      "$PYTHON" "$ROOT/scripts/restore.py" "$STUDY_REPLIES" || exit 2
    fi
    loan "$PYTHON" -m loan stage smollm2-135m-instruct --out "$ROOT/.devdata/sk" --replies "$REPLIES" ${ARGS:-} ;;
  previous)
    # What a resumed run reads of an earlier one's output ($2), and nothing else.
    need "${2:-}/replies.npz.xz" "a GPU run: name its output folder"
    rm -rf "$ROOT/.devdata/sk/previous" && mkdir -p "$ROOT/.devdata/sk/previous" \
      && cp -r "$2"/n[0-9]* "$2/replies.npz.xz" "$ROOT/.devdata/sk/previous/" \
      && { [ ! -f "$2/compiled.tar" ] || cp "$2/compiled.tar" "$ROOT/.devdata/sk/previous/"; } ;;
  unpack1)
    need .devdata/sk/part1/teacher.tar.0 "gpu_students.sh stage (part 1)"
    mkdir -p "$W" && rm -rf "$W/part1" && cp -r .devdata/sk/part1 "$W/"
    python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__, torch.cuda.get_device_name(0))" ;;
  unpack-previous)
    need .devdata/sk/previous/replies.npz.xz "gpu_students.sh previous"
    mkdir -p "$W" && rm -rf "$W/previous" && cp -r .devdata/sk/previous "$W/" ;;
  run)
    mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)  # absolute: `loan` runs from this folder
    if [ -n "${DRY:-}" ]; then  # this CPU, the checkout's venv, a staged tiny teacher
      TQDM_DISABLE=1 loan "$PYTHON" -m loan run "$STAGE" --out "$OUT" --device cpu ${ARGS:-} 2>&1 | tee "$OUT/loan.log"
      exit "${PIPESTATUS[0]}"
    fi
    need .devdata/sk/part2/stage.json "gpu_students.sh stage (part 2)"
    need "$W/part1/teacher.tar.0" "gpu_students.sh unpack1"
    rm -rf "$W/part2" "$W/site" && cp -r .devdata/sk/part2 "$W/"
    # The gguf package the machine may lack, on the path before Python starts (transformers checks for it once).
    mkdir -p "$W/site" && tar -C "$W/site" -xJf "$W/part2/site.tar.xz"
    # No progress bars: a bar's carriage returns would glue the next printed line onto it in the log.
    export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false \
      TQDM_DISABLE=1 HF_HUB_DISABLE_PROGRESS_BARS=1
    [ -z "${RESUME:-}" ] || need "$W/previous/replies.npz.xz" "gpu_students.sh unpack-previous"
    resume=${RESUME:+--resume $W/previous}
    # shellcheck disable=SC2086
    SITE=$W/site loan python3 -m loan run "$W" --out "$OUT" --minutes "${MINUTES:-9}" $resume ${ARGS:-} 2>&1 | tee "$OUT/loan.log"
    exit "${PIPESTATUS[0]}" ;;
  *) echo "gpu_students.sh: unknown step $stage (stage, previous, unpack1, unpack-previous, run)" >&2; exit 2 ;;
esac
