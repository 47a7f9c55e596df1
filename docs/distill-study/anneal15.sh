#!/bin/bash
# Issue 32 at N = 15: the H200 loan's student (docs/distill-study/loan-h200-2026-11-27/n15: 1,818 steps of a
# 32M-token schedule at 8 x 1024 tokens per step, cut mid-schedule at lr ~2.2e-3) annealed on this CPU: from its
# tensors (`--init-from` the snapshot, a fresh AdamW) on the next 1,501,184 train tokens of the split, which the
# loan never reached (`--skip-tokens 14893056`: its 1,818 x 8,192), at the CPU recipe's step (2 x 1024) and a
# quarter of its peak lr (5e-4 / 2.5e-4), 1% warmup, linear decay to 0. The replies are replies-every.jsonl
# (seeded from the committed ids, which answer every prompt).
#   anneal15.sh n15   (resumable: rerun to continue); then score it with the full suite (fp32, --floor)
# The 2026-11-27 run started from the same tensors installed and re-saved as a weights folder (`swiftkv loan
# install`, then `save_swiftkv_params`), before `--init-from` read snapshots; the held-out score at its step 0
# was the loan's last (KL 0.384).
HERE="$(cd "$(dirname "$0")" && pwd)"
export RUN=gpu15anneal-c1r64bfe TOKENS=1501184 REPLIES=replies-every.jsonl REPLY_ENGINE=static \
  MORE_ARGS="--init-from $HERE/loan-h200-2026-11-27/n15 --skip-tokens 14893056 --lr 5e-4 --late-lr 2.5e-4 --warmup 0.01"
exec bash "$HERE/final5.sh" c1r64bfe "$@"
