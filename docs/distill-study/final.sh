#!/bin/bash
# The shipped students, 1,000,000 train tokens each with the `swiftkv` recipe (the study's winner),
# side by side at one thread each (the fastest use of 2 cores, docs/distillation.md). Resumable:
# rerun the script after an interruption. LR overrides the preset's lr when an lr arm beat it.
# Teacher replies: $RUNS/replies-final.jsonl (the study's 1,011 plus those written by gen.sh).
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"  # this checkout
RUNS=${RUNS:-$(dirname "$ROOT")/runs}  # where the runs live: beside the checkout unless RUNS is set
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
SK=$ROOT/.venv/bin/swiftkv
cd $RUNS
LR_ARG=${LR:+--lr $LR}
final() {  # N, alias suffix
  local out=final-n$1
  [ -f $out/config.json ] && return
  local res=""; [ -f $out.ckpt/checkpoint.pt ] && res="--resume"
  OMP_NUM_THREADS=1 /usr/bin/time -v $SK distill n$1-lstsq --recipe swiftkv $LR_ARG --tokens 1M \
    --heldout-tokens 16384 --seq-len 1024 --micro-batch 1 --eval-every 1000 --checkpoint-every 8 --seed 0 \
    --teacher-data replies-final.jsonl --reply-engine vllm --out $out --json $out.json $res \
    >> $out.log 2>&1
}
final 15 & final 22 & wait
