#!/bin/bash
# Teacher replies for the 1M-token finals: the study's 1,011 plus the missing ones, written by vLLM on this CPU.
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"  # this checkout
RUNS=${RUNS:-$(dirname "$ROOT")/runs}  # where the runs live: beside the checkout unless RUNS is set
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
cd $RUNS
time $ROOT/.venv/bin/swiftkv distill n15-lstsq --tokens 1M --heldout-tokens 16384 --seq-len 1024 --seed 0 \
  --teacher-data replies-final.jsonl --reply-engine vllm --out gen-only --stop-after 0 --force
