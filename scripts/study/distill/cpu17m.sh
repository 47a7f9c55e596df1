#!/bin/bash
# Issue 32 item 5 at N = 22: the cpu14m candidate (docs/distill-study/cpu14m-n22-student: the shipped 8M
# -swiftkv25 trained on 4M + 2M more tokens of the same replies) trained on 3M tokens of replies no earlier
# stage saw: `distill --skip-tokens 8001536` passes over the 8M run's documents (the split's first 8,001,536
# train tokens, which every stage so far trained on), and the next ones come from replies-every.jsonl
# (every.sh's replies, written ahead for the loan). From its weights (`--init-from`, a fresh AdamW) at
# cpu14m's quarter of the recipe's peak lr (5e-4 / 2.5e-4), 1% warmup. Fresh replies, against cpu14m's third
# pass over the same ones (+.001 chat top-1 for 2M tokens), is what this stage measures.
#   cpu17m.sh n22   (resumable: rerun to continue)
STUDY="$(cd "$(dirname "$0")/../../../docs/distill-study" && pwd)"  # the study's records
export RUN=cpu17m-c1r64bfe TOKENS=3000320 REPLIES=replies-every.jsonl REPLY_ENGINE=static \
  MORE_ARGS="--init-from $STUDY/cpu14m-n22-student --skip-tokens 8001536 --lr 5e-4 --late-lr 2.5e-4 --warmup 0.01"
exec bash "$(dirname "$0")/final5.sh" c1r64bfe "$@"
