#!/bin/bash
# Issue 32 item 5: an 8M-token run of `final5.sh c1r64bfe` (RUN=cpu8m-c1r64bfe TOKENS=8001536
# REPLIES=replies-8m.jsonl REPLY_ENGINE=static) continued by 8M more tokens: a second pass over the same replies
# in a new order (distill --continue-from, --passes 2), at the lr a single 16M-token run would have had from its
# step 3,907 on (about half the recipe's peaks: 1e-3 / 5e-4), with a 1% warmup.
# (A first try re-warmed to the recipe's peaks, 2e-3 / 1e-3: held-out KL 0.383 -> 0.468 by step 300; stopped.)
#   cpu16m.sh n15 | n22 | ship15 | ship22   (resumable: rerun to continue)
export RUN=cpu16m-c1r64bfe TOKENS=16003072 PASSES=2 CONTINUE_FROM=cpu8m-c1r64bfe \
  REPLIES=replies-8m.jsonl REPLY_ENGINE=static MORE_ARGS="--lr 1e-3 --late-lr 5e-4 --warmup 0.01"
exec bash "$(dirname "$0")/final5.sh" c1r64bfe "$@"
