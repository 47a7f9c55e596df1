#!/bin/bash
# The shipped students, round 2: 1,000,000 train tokens each with the `swiftkv` recipe after the
# round-3 study made R13 (teacher replies cut at 64 tokens) its winner, then the same full-suite eval
# command as before. Each stage skips itself when done: rerun the script after an interruption.
#  1. teacher replies for both runs (one process writes the cache: the N = 15 run, stopped after its
#     first step); starts from the study's 821 replies of 64 tokens (replies-64.jsonl);
#  2. N = 15 alone at 2 threads, its tensors installed as -swiftkv50, the full eval (the unchanged
#     -swiftkv25 comes from the eval's cache), the Paris answer;
#  3. the same for N = 22 / -swiftkv25.
# (Sequential, not side by side: a session holds ~one student's training plus its ~40-min eval.)
ROOT="$(cd "$(dirname "$0")/../../.." && pwd)"  # this checkout
RUNS=${RUNS:-$(dirname "$ROOT")/runs}  # where the runs live: beside the checkout unless RUNS is set
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
SK=$ROOT/.venv/bin/swiftkv
PY=$ROOT/.venv/bin/python
cd $RUNS
[ -f replies-final64.jsonl ] || cp replies-64.jsonl replies-final64.jsonl
distill() {  # N, then extra arguments
  local n=$1 out=final64-n$1; shift
  [ -f $out/config.json ] && return
  local res=""; [ -f $out.ckpt/checkpoint.pt ] && res="--resume"
  /usr/bin/time -a -o $out-wall.txt $SK distill n$n-lstsq --recipe swiftkv --reply-tokens 64 --tokens 1M \
    --heldout-tokens 16384 --seq-len 1024 --micro-batch 1 --eval-every 1000 --checkpoint-every 8 --seed 0 \
    --teacher-data replies-final64.jsonl --reply-engine vllm --out $out --json $out.json $res "$@" \
    >> $out.log 2>&1
}
ship() {  # N, alias: install the tensors, score them with the same command as docs/eval-full, ask Paris
  local n=$1 alias=$2
  [ -f final64-n$n/config.json ] || return 1
  [ -f shipped64-n$n.txt ] && return
  $PY -c "import swiftkv; from transformers import AutoModelForCausalLM as A
from swiftkv.model.surgery import save_swiftkv_params as s
s(A.from_pretrained('final64-n$n'), '$ROOT/src/swiftkv/weights/$alias', base='smollm2-135m-instruct')"
  /usr/bin/time -v $SK eval smollm2-135m-instruct-swiftkv50 smollm2-135m-instruct-swiftkv25 \
    --teacher smollm2-135m-instruct --limit hellaswag=2000,mmlu=2000 --out eval-full64-n$n --no-progress \
    > eval-full64-n$n.log 2>&1 || return 1
  $SK generate $alias "What is the capital of France?" > paris64-n$n.txt 2> paris64-n$n.err
  date > shipped64-n$n.txt
}
[ -f final64-n15.ckpt/checkpoint.pt ] || [ -f final64-n15/config.json ] || distill 15 --stop-after 1
distill 15 && ship 15 smollm2-135m-instruct-swiftkv50 || exit 1
[ -f n22-lstsq/config.json ] || $SK convert smollm2-135m-instruct n22-lstsq --num-key-value-layers 22 --init lstsq > convert22.log 2>&1
distill 22 && ship 22 smollm2-135m-instruct-swiftkv25
