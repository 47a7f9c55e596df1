#!/bin/bash
# Issue 32 item 5 at N = 15: the shipped 16M-token -swiftkv50 (the 8M run + its --continue-from second pass,
# both over replies-8m's first 8,001,536 train tokens) trained on 2M tokens of replies it never saw: from its
# weights folder (`distill --init-from ALIAS`, a fresh AdamW), `--skip-tokens 8001536` past the documents
# both its passes took, replies from replies-every.jsonl (every.sh's, written ahead for the loan). At half
# the recipe's peak lr (1e-3 / 5e-4, as its own second pass), 1% warmup: N = 15 is far from its teacher
# (held-out KL 0.344), where cpu17m.sh's quarter-peak suited N = 22's 0.045.
#   cpu18m.sh n15   (resumable: rerun to continue)
export RUN=cpu18m-c1r64bfe TOKENS=2000896 REPLIES=replies-every.jsonl REPLY_ENGINE=static \
  MORE_ARGS="--init-from smollm2-135m-instruct-swiftkv50 --skip-tokens 8001536 --lr 1e-3 --late-lr 5e-4 --warmup 0.01"
exec bash "$(dirname "$0")/final5.sh" c1r64bfe "$@"
