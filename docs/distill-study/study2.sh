#!/bin/bash
# Recipe study, N=15, equal budget (262,144 train tokens per arm), same seed and split as study.sh;
# the arms after R1. Teacher replies: $RUNS/replies.jsonl (1,011 greedy replies of the plain
# teacher, written by `--reply-engine hf` in bf16 on a lent H100; the first ~480 serve these arms).
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"  # this checkout
RUNS=${RUNS:-$(dirname "$ROOT")/runs}  # where the runs live: beside the checkout unless RUNS is set
set -x
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
SK=$ROOT/.venv/bin/swiftkv
cd $RUNS
COMMON="--tokens 262144 --heldout-tokens 16384 --seq-len 1024 --batch-size 2 --micro-batch 1 --eval-every 1000 --checkpoint-every 8 --seed 0"
for arm in "$@"; do
  case $arm in
    r2) ARGS="--recipe reference --init lstsq --targets teacher" ;;
    r3) ARGS="--recipe reference --init lstsq --targets teacher --kl-mean-over targets" ;;
    r4) ARGS="--recipe reference --init lstsq --targets mixed --kl-mean-over targets" ;;
    r5) ARGS="--recipe reference --init lstsq --targets teacher --kl-mean-over targets --lr 1e-3" ;;
    r6) ARGS="--recipe reference --init lstsq --targets teacher --kl-mean-over targets --mse-weight 0" ;;
    r7) ARGS="--recipe reference --init lstsq --targets mixed --kl-mean-over targets --mse-weight 0" ;;
    r8) ARGS="--recipe reference --init lstsq --targets teacher --kl-mean-over targets --mse-weight 0 --lr 1e-3" ;;
    r9) ARGS="--recipe reference --init lstsq --targets teacher --kl-mean-over targets --mse-weight 0 --lr 2e-3" ;;
    # Not run yet. R10: R9 (= the swiftkv preset) at T = 1: T = 2 spreads the loss over the tail of
    # the distribution, while greedy agreement (the first-divergence measure) lives at the argmax.
    r10) ARGS="--recipe swiftkv --temperature 1" ;;
  esac
  if [ ! -f study-$arm/config.json ]; then
    RES=""; [ -f study-$arm.ckpt/checkpoint.pt ] && RES="--resume"
    cp -n replies.jsonl replies-$arm.jsonl
    $SK distill n15-lstsq $ARGS $COMMON --teacher-data replies-$arm.jsonl --out study-$arm --json study-$arm.json $RES
  fi
  [ -f eval-$arm/results.json ] || $SK eval study-$arm --teacher smollm2-135m-instruct --tasks none --out eval-$arm --no-progress
done
