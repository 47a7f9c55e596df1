#!/bin/bash
# Issue 32 item 5 at N = 22: the cpu12m candidate (the shipped 8M -swiftkv25 trained on 4M more tokens,
# docs/distill-study/cpu12m-n22-student) trained on 2M more tokens of the same replies (the split's first 2M,
# seen twice before) from its weights (`distill --init-from`, a fresh AdamW) at a quarter of the recipe's
# peak lr (5e-4 / 2.5e-4), where cpu12m's half-peak stage lost ground for its first ~800 steps.
#   cpu14m.sh n22   (resumable: rerun to continue)
STUDY="$(cd "$(dirname "$0")/../../../docs/distill-study" && pwd)"  # the study's records
export RUN=cpu14m-c1r64bfe TOKENS=2000896 REPLIES=replies-8m.jsonl REPLY_ENGINE=static \
  MORE_ARGS="--init-from $STUDY/cpu12m-n22-student --lr 5e-4 --late-lr 2.5e-4 --warmup 0.01"
exec bash "$(dirname "$0")/final5.sh" c1r64bfe "$@"
