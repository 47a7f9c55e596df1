#!/bin/bash
# Study round 4, on a quiet machine after the runs: training tok/s and peak memory of each capacity
# arm's own trainable set (swiftkv distill --speed 3), in $RUNS beside n15-lstsq.
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"  # this checkout
RUNS=${RUNS:-$(dirname "$ROOT")/runs}  # where the runs live: beside the checkout unless RUNS is set
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
source "$(dirname "$0")/arms4.sh"
cd $RUNS
SK="$ROOT/.venv/bin/python -m swiftkv.cli"
STEP="--seq-len 1024 --batch-size 2 --micro-batch 1 --seed 0 --targets human"
for arm in r13 c1r16 c1r64 c2 c3; do
  ARGS=$(arm_args "$arm") || exit 2
  [ -f speed-$arm.json ] || PYTHONPATH=$ROOT/src $SK distill n15-lstsq $ARGS $STEP --speed 3 --json speed-$arm.json > speed-$arm.log 2>&1
done
