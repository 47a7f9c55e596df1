#!/bin/bash
# Issue 32 item 5 at N = 15, on an AVX2-only CPU (fp32): the shipped -swiftkv50 (docs/distill-study/
# soup15more-n15-student, rank 128) trained on the last of the every-turn split's train documents that no
# ancestor saw (`--skip-tokens 17393664`: the loan's N = 15 and soup15more's stage together trained the first
# 17,393,664 tokens; --tokens asks for more than is left, so the run takes what there is, ~0.6M), from its
# weights (`--init-from`, a fresh AdamW, rank 128) at soup15more's quarter of the recipe's peak lr (5e-4 /
# 2.5e-4), 1% warmup. What it measures: what the split's last unseen tokens add to the shipped student.
#   last15.sh n15   (resumable: rerun to continue)
HERE="$(cd "$(dirname "$0")" && pwd)"
export RUN=last15-c1r64bfe TOKENS=1001472 REPLIES=replies-every.jsonl REPLY_ENGINE=static \
  MORE_ARGS="--init-from $HERE/soup15more-n15-student --lora-rank 128 --skip-tokens 17393664 --lr 5e-4 --late-lr 2.5e-4 --warmup 0.01 --dtype auto"
exec bash "$HERE/final5.sh" c1r64bfe "$@"
