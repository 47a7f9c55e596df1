#!/bin/bash
# Issue 32 item 5 at N = 22: the shipped -swiftkv25 (docs/distill-study/cpu17m-n22-student, 17M tokens)
# trained on the next 1M tokens no earlier stage saw (`--skip-tokens 11001856`: the 8M runs' documents, then
# cpu17m's 3M), from its weights (`--init-from`, a fresh AdamW) at an eighth of the recipe's peak lr
# (2.5e-4 / 1.25e-4), 1% warmup. A stage on a decayed student bumped at every re-warm tried so far (half peak
# +8-9% held-out KL at N = 15, quarter peak +2.5%); whether an eighth avoids the bump is what this measures.
# `--dtype auto` over the arm's bf16: the hardware picks (fp32 on a CPU without fast bf16, e.g. an AVX2-only
# EPYC, where bf16 matmuls run at about 1 GFLOP/s).
#   eighth22.sh n22   (resumable: rerun to continue)
STUDY="$(cd "$(dirname "$0")/../../../docs/distill-study" && pwd)"  # the study's records
export RUN=eighth-c1r64bfe TOKENS=1001472 REPLIES=replies-every.jsonl REPLY_ENGINE=static \
  MORE_ARGS="--init-from $STUDY/cpu17m-n22-student --skip-tokens 11001856 --lr 2.5e-4 --late-lr 1.25e-4 --warmup 0.01 --dtype auto"
exec bash "$(dirname "$0")/final5.sh" c1r64bfe "$@"
