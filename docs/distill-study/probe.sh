#!/bin/bash
# `swiftkv distill --speed` on the blocks of the run its command describes (since 2026-11-28), checked against
# that run's own steps and against the blocks the probe used to time (the data's human answers as targets):
# N = 15, soup15more's student settings (rank-128 adapters from the N = 15 soup, every-turn teacher replies),
# fp32, 2 threads, alone. Writes probe-{teacher,human}-speed.json and probe-run-distill.json in $RUNS/probe.
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"  # this checkout
RUNS=${RUNS:-$(dirname "$ROOT")/runs}  # where the runs live: beside the checkout unless RUNS is set
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PYTHONPATH=${SWIFTKV_SRC:-$ROOT/src}
SK="$ROOT/.venv/bin/python -m swiftkv.cli"
HERE="$(cd "$(dirname "$0")" && pwd)"
mkdir -p $RUNS/probe && cd $RUNS || exit 1
[ -f replies-every.jsonl ] || xz -dc "$HERE/replies-every-ids.jsonl.xz" > replies-every.jsonl
[ -f n15-lstsq/config.json ] || $SK convert smollm2-135m-instruct n15-lstsq --num-key-value-layers 15 --init lstsq > convert15.log 2>&1
STUDENT="n15-lstsq --recipe swiftkv --trainable lora --lora-rank 128 --late-lr 2.5e-4 --lr 5e-4 --warmup 0.01 \
  --heldout-tokens 16384 --seq-len 1024 --batch-size 2 --micro-batch 1 --seed 0 --dtype float32 --tokens 40960 \
  --init-from $HERE/soup15-n15-student"
TEACHER="--prompt-turns every --teacher-data replies-every.jsonl --reply-engine static"
$SK distill $STUDENT $TEACHER --speed 3 --json probe/probe-teacher-speed.json > probe/teacher.log 2>&1
$SK distill $STUDENT --targets human --speed 3 --json probe/probe-human-speed.json > probe/human.log 2>&1
$SK distill $STUDENT $TEACHER --eval-every 1000 --checkpoint-every 1000 --stop-after 8 --out probe/run \
  --json probe/probe-run-distill.json > probe/run.log 2>&1
