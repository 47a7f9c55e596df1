#!/bin/bash
# Issue 32 at N = 15: a long-prompt last stage on the shipped -swiftkv50 (docs/distill-study/soup15more-n15-student,
# rank 128), from its weights (`--init-from`, a fresh AdamW), in 2048-token blocks with a quarter of the written
# tokens in 1-2k-token prompts (passages + a question, a document + a summary request; --long-share 0.25), at
# long1m.sh's quarter of the recipe's peak lr (5e-4 / 2.5e-4), 5% warmup, for 600k tokens (what an AVX2-only CPU
# trains in about 45 minutes in fp32). long1m.sh's stage moved long prompts (+.030 long top-1) at a cost of 0.25
# knowledge points; this one is shorter, and its equal mean with its start (soup.sh) is the hedge.
#   long15.sh        (resumable: rerun to continue)
ROOT="$(cd "$(dirname "$0")/../../.." && pwd)"  # this checkout
RUNS=${RUNS:-$(dirname "$ROOT")/runs}  # where the runs live: beside the checkout unless RUNS is set
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONPATH=${SWIFTKV_SRC:-$ROOT/src}
STUDY="$ROOT/docs/distill-study"  # the study's records
SK="$ROOT/.venv/bin/python -m swiftkv.cli"
cd $RUNS
out=long15-n15
[ -f replies-long15.jsonl ] || cp replies-every.jsonl replies-long15.jsonl
if [ ! -f $out/config.json ]; then
  res=""; [ -f $out.ckpt/checkpoint.pt ] && res="--resume"
  /usr/bin/time -v -a -o $out-time.txt $SK distill n15-lstsq --recipe swiftkv-lora --lora-rank 128 \
    --dtype auto --prompt-turns every --tokens 600k --heldout-tokens 16384 --seq-len 2048 --batch-size 1 \
    --micro-batch 1 --long-share 0.25 --lr 5e-4 --late-lr 2.5e-4 --warmup 0.05 --eval-every 100 --checkpoint-every 8 \
    --seed 0 --teacher-data replies-long15.jsonl --reply-engine static --init-from $STUDY/soup15more-n15-student \
    --out $out --json $out.json $res >> $out.log 2>&1 || exit 1
fi
