#!/bin/bash
# Issue 32 item 5 at N = 22 on a machine that lacks the 8M run's checkpoint (the machine changed): the
# shipped 8M-token -swiftkv25 (its weights folder: `distill --init-from ALIAS`, a fresh AdamW) trained
# on 4M more tokens of the same teacher replies (replies-8m, every-turn prompts, seed 0: the split's
# first 4M tokens, seen once before) at about half the recipe's peak lr, as cpu16m.sh's continuations
# had, with a 1% warmup.
#   cpu12m.sh n22 | ship22   (resumable: rerun to continue)
export RUN=cpu12m-c1r64bfe TOKENS=4001792 REPLIES=replies-8m.jsonl REPLY_ENGINE=static \
  MORE_ARGS="--init-from smollm2-135m-instruct-swiftkv25 --lr 1e-3 --late-lr 5e-4 --warmup 0.01"
exec bash "$(dirname "$0")/final5.sh" c1r64bfe "$@"
