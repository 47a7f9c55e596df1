#!/bin/bash
# Study round 4, on a quiet machine after the runs (copy into the runs folder, beside n15-lstsq): training tok/s and peak memory of each capacity arm's own trainable set (swiftkv distill --speed 3).
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
cd /work/runs
SK="/work/main/.venv/bin/python -m swiftkv.cli"
STEP="--seq-len 1024 --batch-size 2 --micro-batch 1 --seed 0 --targets human"
for arm in r13 c1r16 c1r64 c2 c3; do
  case $arm in
    r13) ARGS="--recipe swiftkv" ;;
    c1r16) ARGS="--recipe swiftkv --trainable lora --lora-rank 16 --late-lr 1e-3" ;;
    c1r64) ARGS="--recipe swiftkv --trainable lora --lora-rank 64 --late-lr 1e-3" ;;
    c2) ARGS="--recipe swiftkv --trainable late --late-lr 2e-4" ;;
    c3) ARGS="--recipe swiftkv --trainable late-norms --late-lr 2e-4" ;;
  esac
  [ -f speed-$arm.json ] || PYTHONPATH=/work/main/src $SK distill n15-lstsq $ARGS $STEP --speed 3 --json speed-$arm.json > speed-$arm.log 2>&1
done
