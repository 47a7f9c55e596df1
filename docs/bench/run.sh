#!/bin/bash
# The serving measurements of README/docs/serving.md, alone on the machine, in this order:
# offline bench (dtype auto, then fp32 for the dtype comparison), the mixed-step profile, then the
# online benchmark (16 requests per rate, 4 rates from 0.25x to 2x the baseline's prefill-bound
# capacity: a full 64 x 6 run takes hours on 2 cores). Each step skips itself when its output exists.
set -x
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
SK=${SK:-/work/main/.venv/bin/swiftkv}
OUT=${OUT:-/work/main/docs/bench}
MODEL=smollm2-135m-instruct-swiftkv50 BASE=smollm2-135m-instruct
{ lscpu | grep "Model name"; grep -ow "avx512_bf16\|amx_bf16" /proc/cpuinfo | sort -u; } > $OUT/cpu.txt
[ -f $OUT/auto/bench.json ] || $SK bench $MODEL --baseline $BASE --out $OUT/auto > $OUT/auto.log 2>&1
[ -f $OUT/fp32/bench.json ] || $SK bench $MODEL --baseline $BASE --dtype float32 --out $OUT/fp32 > $OUT/fp32.log 2>&1
[ -f $OUT/profile/profile.json ] || $SK bench $MODEL --baseline $BASE --profile --out $OUT/profile > $OUT/profile.log 2>&1
[ -f $OUT/online/online.png ] || $SK bench $MODEL --baseline $BASE --online --num-requests 16 \
  --rate-multipliers 0.25,0.5,1,2 --out $OUT/online > $OUT/online.log 2>&1
