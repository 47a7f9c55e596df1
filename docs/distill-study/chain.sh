#!/bin/bash
# gen.sh (the teacher replies for 1M tokens, already running) -> R9 (lr 2e-3) + its eval -> the finals at the lr with the lower chat KL (R8 1e-3 vs R9 2e-3).
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"  # this checkout
RUNS=${RUNS:-$(dirname "$ROOT")/runs}  # where the runs live: beside the checkout unless RUNS is set
cd $RUNS
while pgrep -f gen.sh > /dev/null; do sleep 20; done
bash $ROOT/docs/distill-study/study2.sh r9 > study-r9.log 2>&1
LR=$(python3 -c "
import json
kl = lambda a: json.load(open(f'eval-{a}/results.json'))['students'][0]['teacher_forced']['kl_mean']
print('2e-3' if kl('r9') < kl('r8') else '')")
echo "final lr override: '${LR}'" > final-lr.txt
LR=$LR bash $ROOT/docs/distill-study/final.sh
