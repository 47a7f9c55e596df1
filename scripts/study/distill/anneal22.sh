#!/bin/bash
# Issue 32 at N = 22: the H200 loan's student (docs/distill-study/loan-h200-2026-11-27/n22: 2,675 steps of a
# 32M-token schedule at 8 x 1024 tokens per step, 21.9M tokens, cut mid-schedule at lr ~1.3e-3) annealed on
# this CPU: from its snapshot (`--init-from`, a fresh AdamW) on the split's first 1,001,472 train tokens (the
# loan saw every prompt once and some twice: no reply is unseen), at the CPU recipe's step (2 x 1024) and a
# quarter of its peak lr (5e-4 / 2.5e-4), 1% warmup, linear decay to 0.
#   anneal22.sh n22   (resumable: rerun to continue)
STUDY="$(cd "$(dirname "$0")/../../../docs/distill-study" && pwd)"  # the study's records
export RUN=gpu22anneal-c1r64bfe TOKENS=1001472 REPLIES=replies-every.jsonl REPLY_ENGINE=static \
  MORE_ARGS="--init-from $STUDY/loan-h200-2026-11-27/n22 --lr 5e-4 --late-lr 2.5e-4 --warmup 0.01"
exec bash "$(dirname "$0")/final5.sh" c1r64bfe "$@"
