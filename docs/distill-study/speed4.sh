#!/bin/bash
# Study round 4, on a quiet machine after the runs: training tok/s and peak memory of each capacity
# arm's own trainable set (swiftkv distill --speed 3), in /work/runs beside n15-lstsq.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
source "$(dirname "$0")/arms4.sh"
cd /work/runs
SK="/work/main/.venv/bin/python -m swiftkv.cli"
STEP="--seq-len 1024 --batch-size 2 --micro-batch 1 --seed 0 --targets human"
for arm in r13 c1r16 c1r64 c2 c3; do
  ARGS=$(arm_args "$arm") || exit 2
  [ -f speed-$arm.json ] || PYTHONPATH=/work/main/src $SK distill n15-lstsq $ARGS $STEP --speed 3 --json speed-$arm.json > speed-$arm.log 2>&1
done
