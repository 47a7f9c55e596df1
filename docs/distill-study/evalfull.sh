#!/bin/bash
# The same full-suite command as docs/eval-full (2026-11-22), on the 1M-token students.
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"  # this checkout
RUNS=${RUNS:-$(dirname "$ROOT")/runs}  # where the runs live: beside the checkout unless RUNS is set
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
cd $RUNS
/usr/bin/time -v $ROOT/.venv/bin/swiftkv eval smollm2-135m-instruct-swiftkv50 smollm2-135m-instruct-swiftkv25 \
  --teacher smollm2-135m-instruct --limit hellaswag=2000,mmlu=2000 --out eval-full-new --no-progress
