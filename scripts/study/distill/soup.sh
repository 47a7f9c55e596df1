#!/bin/bash
# Issue 32 without a GPU: a weight-space average ("soup", soup.py) of two students of one N, scored as the shipped
# ones are. A student is a trained-tensor folder or a loan's snapshot (e.g. docs/distill-study/loan-h200-2026-11-27/n15),
# which soup.py reads as one and distill's --init-from takes as it is. Stages (default all; each skips itself when done):
#   soup      OUT = the mean of the students (exact: its rank is the sum of theirs)
#   heldout   each student's and the soup's held-out KL / top-1 on distill's split (fp32), as JSON
#   eval      the full suite of the shipped students (fp32, --floor)
#   [WEIGHTS=W,W] [RANK=R] soup.sh N OUT STUDENT_FOLDER STUDENT_FOLDER [STAGE...]
#   (WEIGHTS: soup.py --weights; RANK: soup.py --rank, the mean's changes as their best rank-R factors, for a mean
#   whose side-by-side factors would double the shipped file for almost nothing)
# e.g. soup.sh 22 soup22-a docs/distill-study/cpu17m-n22-student docs/distill-study/anneal22-n22-student
ROOT="$(cd "$(dirname "$0")/../../.." && pwd)"  # this checkout
RUNS=${RUNS:-$(dirname "$ROOT")/runs}  # where the runs live: beside the checkout unless RUNS is set
set -e
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false VLLM_CPU_NUM_OF_RESERVED_CPU=0
export PYTHONPATH=${SWIFTKV_SRC:-$ROOT/src}
HERE="$(cd "$(dirname "$0")" && pwd)"
PY=$ROOT/.venv/bin/python
SK="$PY -m swiftkv.cli"
N=$1 OUT=$2 A=$(realpath "$3") B=$(realpath "$4"); shift 4
cd $RUNS
STAGES=${*:-soup heldout eval}
[ -f n$N-lstsq/config.json ] || $SK convert smollm2-135m-instruct n$N-lstsq --num-key-value-layers $N --init lstsq

rank() { $PY -c "import sys; from pathlib import Path; from swiftkv.distill.from_weights import folder_spec; \
print(folder_spec(Path(sys.argv[1]))['student_rank'])" "$1"; }
name() {  # a student's name in the records: its folder's; a snapshot's (n15) with its loan's folder before it
  if [ -f "$1/swiftkv.json" ]; then basename "$1"; else echo "$(basename "$(dirname "$1")")-$(basename "$1")"; fi
}
heldout() {  # $1 a student: its held-out KL / top-1 before any step (distill --stop-after 0)
  local name; name=$(name "$1")
  [ -f heldout-$name.json ] && return
  $SK distill n$N-lstsq --recipe swiftkv-lora --lora-rank "$(rank "$1")" --tokens 20480 --heldout-tokens 16384 \
    --seq-len 1024 --batch-size 2 --micro-batch 1 --seed 0 --prompt-turns every --dtype float32 \
    --teacher-data replies-every.jsonl --reply-engine static --init-from "$1" --stop-after 0 \
    --out "$RUNS/heldout-$name" --json heldout-$name.json > heldout-$name.log 2>&1
}
for stage in $STAGES; do
  case $stage in
    soup) [ -f $OUT/swiftkv.json ] || $PY "$HERE/soup.py" $OUT "$A" "$B" ${WEIGHTS:+--weights=$WEIGHTS} ${RANK:+--rank=$RANK} ;;
    heldout) for s in "$A" "$B" "$PWD/$OUT"; do heldout "$s"; done ;;
    eval) [ -f eval-$OUT/results.json ] || /usr/bin/time -v $SK eval "$PWD/$OUT" --teacher smollm2-135m-instruct \
      --limit hellaswag=2000,mmlu=2000 --floor --dtype float32 --out eval-$OUT --no-progress > eval-$OUT.log 2>&1 ;;
    *) echo "unknown stage $stage (expected soup, heldout, eval)" >&2; exit 2 ;;
  esac
done
