#!/bin/bash
# Issue 32: does a long-prompt second stage lift -swiftkv50's long-prompt measures? The 16M student
# (cpu16m-c1r64bfe-n15.ckpt) + 1M tokens in 2048-token blocks with a quarter of the written tokens in 1-2k-token
# prompts (passages + a question, a document + a summary request; --long-share 0.25), at a quarter of the
# recipe's peak lr (no warm restart to the peaks: that undid the 8M run's end). Resumable: rerun to continue.
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"  # this checkout
RUNS=${RUNS:-$(dirname "$ROOT")/runs}  # where the runs live: beside the checkout unless RUNS is set
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONPATH=${SWIFTKV_SRC:-$ROOT/src}
SK="$ROOT/.venv/bin/python -m swiftkv.cli"
cd $RUNS
out=long1m-n15
if [ ! -f $out/config.json ]; then
  res=""; [ -f $out.ckpt/checkpoint.pt ] && res="--resume"
  /usr/bin/time -v -a -o $out-time.txt $SK distill n15-lstsq --recipe swiftkv --trainable lora --lora-rank 64 \
    --dtype bfloat16 --prompt-turns every --tokens 1M --heldout-tokens 16384 --seq-len 2048 --batch-size 1 \
    --micro-batch 1 --long-share 0.25 --lr 5e-4 --late-lr 2.5e-4 --warmup 0.05 --eval-every 100 --checkpoint-every 8 \
    --seed 0 --teacher-data replies-long1m.jsonl --reply-engine static --init-from cpu16m-c1r64bfe-n15.ckpt \
    --out $out --json $out.json $res >> $out.log 2>&1 || exit 1
fi
[ -f eval-$out/results.json ] || /usr/bin/time -v $SK eval $RUNS/$out --teacher smollm2-135m-instruct \
  --limit hellaswag=2000,mmlu=2000 --floor --dtype float32 --out eval-$out --no-progress > eval-$out.log 2>&1
