#!/bin/bash
# Issue 32 item 5 at N = 15: the cpu18m candidate (the shipped 16M-token -swiftkv50 + 2M tokens of unseen
# replies at half peak lr; cpu18m.sh n15 writes its checkpoint) trained on the next 1.5M tokens no earlier
# stage saw (`--skip-tokens 10002432`: the 8M runs' documents, then cpu18m's), from its trained tensors
# (`--init-from` its checkpoint, a fresh AdamW) at a quarter of the recipe's peak lr (5e-4 / 2.5e-4), 1%
# warmup: cpu18m's half-peak stage spent 70% of its steps recovering a +8-9% KL bump, while anneal15.sh's
# quarter-peak stage on a fresh optimizer went down from its first 100 steps.
#   cpu19m.sh n15   (resumable: rerun to continue)
export RUN=cpu19m-c1r64bfe TOKENS=1501184 REPLIES=replies-every.jsonl REPLY_ENGINE=static \
  MORE_ARGS="--init-from cpu18m-c1r64bfe-n15.ckpt --skip-tokens 10002432 --lr 5e-4 --late-lr 2.5e-4 --warmup 0.01"
exec bash "$(dirname "$0")/final5.sh" c1r64bfe "$@"
