#!/bin/bash
# Does the bump of a stage on a decayed student come from a fresh AdamW? cpu19m.sh's first 100 steps again,
# from cpu18m's checkpoint with its AdamW state too (`--keep-moments`). That option existed at commit f391fac
# only (reverted in bfcfe6d: this check found it changed nothing), so run this script from a checkout of it.
#   km19.sh n15
HERE="$(cd "$(dirname "$0")" && pwd)"
export RUN=km19-c1r64bfe TOKENS=1501184 REPLIES=replies-every.jsonl REPLY_ENGINE=static STOP_AFTER=100 \
  MORE_ARGS="--init-from cpu18m-c1r64bfe-n15.ckpt --skip-tokens 10002432 --lr 5e-4 --late-lr 2.5e-4 --warmup 0.01 --keep-moments"
exec bash "$HERE/final5.sh" c1r64bfe "$@"
