#!/bin/bash
# Issue 22, item 5: SwiftKV with ngram speculative decoding served under load, alone on the machine.
# The models and server settings are those of run.sh's online benchmark (16 requests per rate, 4 rates
# from 0.25x to 2x the baseline's prefill-bound capacity), on the extractive workload (passages + a
# question, a document + a summary request: n-grams of the prompt recur in the answer):
#   both/          SwiftKV + ngram against baseline + ngram (the same speculator on each server)
#   swiftkv-only/  SwiftKV + ngram against the plain baseline (no speculator)
#   decode-steps/  the decode-only step of both models over 128 steps (8 x 2000-token sequences)
# Each writes JSON + PNG into $OUT/<name>/ and its log beside it; each step skips itself when its
# output exists.
ROOT="$(cd "$(dirname "$0")/../../.." && pwd)"  # this checkout
RUNS=${RUNS:-$(dirname "$ROOT")/runs}  # where the runs live: beside the checkout unless RUNS is set
set -x
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
SK=${SK:-$ROOT/.venv/bin/swiftkv}
OUT=${OUT:-$ROOT/docs/bench/online-spec}
MODEL=smollm2-135m-instruct-swiftkv50 BASE=smollm2-135m-instruct
NGRAM='{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}'
ONLINE=(--online --workload extractive --num-requests 16 --rate-multipliers 0.25,0.5,1,2
        --speculative-config "$NGRAM")
mkdir -p $OUT
{ lscpu | grep "Model name"; grep -ow "avx512_bf16\|amx_bf16" /proc/cpuinfo | sort -u; } > $OUT/cpu.txt
[ -f $OUT/both/online.png ] || $SK bench $MODEL --baseline $BASE "${ONLINE[@]}" --speculate both \
  --out $OUT/both > $OUT/both.log 2>&1
[ -f $OUT/swiftkv-only/online.png ] || $SK bench $MODEL --baseline $BASE "${ONLINE[@]}" --speculate swiftkv \
  --out $OUT/swiftkv-only > $OUT/swiftkv-only.log 2>&1
[ -f $OUT/decode-steps/decode-steps.png ] || $SK bench $MODEL --baseline $BASE --decode-steps \
  --out $OUT/decode-steps > $OUT/decode-steps.log 2>&1
