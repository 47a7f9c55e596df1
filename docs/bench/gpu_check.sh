#!/bin/bash
# Issue 33's serving check on a lent GPU box (torch 2.11 + cu130, Python 3.12, transformers, no vLLM, no
# network): vLLM 0.26.0 (its CUDA 13 wheel pins the box's torch) travels in two parts, then
# docs/bench/gpu_check.py runs every case and writes its JSON and table under $OUT as it goes.
#
#   bash docs/bench/gpu_check.sh stage     # here, with network: builds .devdata/gc1 and .devdata/gc2
#   then two calls of the device tool from the repository root (shipped weights moved out of the tree
#   first with `stash`, so each call carries the code plus one part, under 64 MiB):
#     carry [".devdata/gc1"]: bash docs/bench/gpu_check.sh unpack1
#     carry [".devdata/gc2"]: bash docs/bench/gpu_check.sh unpack2-and-run   (the check itself, ~6 min)
#   bash docs/bench/gpu_check.sh stash | unstash   # what the box never reads out of the tree and back
#                                                  # (`swiftkv loan stash`: shipped weights, docs' records)
# The box keeps /root/gc only while it is warm (30 s after a call): make the second call at once. Sizes
# (2026-11-26): part 1 32 MB, part 2 54 MB; the tree after `stash` 1.1 MiB (2026-11-27).
#   DRY=1 bash docs/bench/gpu_check.sh run         # this script's run stage on a CPU, with the local venv
#
# Part 1: vLLM's Python sources, its FlashAttention-3 library and the small packages vLLM imports that the
# box lacks. Part 2: vLLM's `_C_stable_libtorch` kernels. Left out (size): FlashAttention-2 (Hopper runs
# FA3), the MoE kernels, numba (so the ngram case records an import error there; a third call could add it).
set -uo pipefail
stage=$1
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
W=${W:-/root/gc}
SITE=$W/site
OUT=${OUT:-$W/out}
VLLM=0.26.0
# What vLLM 0.26 imports beyond torch and transformers (the read-only study of 2026-11-26, FACTS.md), at
# the versions its metadata asks for where the registry has them (llguidance: 1.6.1, the newest here, for
# its >=1.7), installed with --no-deps, so nothing else checks them.
DEPS="pydantic>=2.12 pydantic-core annotated-types typing-inspection openai>=2 httpx sniffio openai-harmony cbor2
      pyzmq>=25 msgspec pybase64 cachetools llguidance xgrammar>=0.2.1,<1 apache-tvm-ffi==0.1.10
      fastapi>=0.133,<0.137 starlette>=1.0.1 opentelemetry-api partial-json-parser blake3 py-cpuinfo
      prometheus-client cloudpickle einops setproctitle distro jiter anyio h11 httpcore importlib-metadata zipp
      lark==1.2.2"

stage() {
  local build=$ROOT/.devdata/gc-build
  rm -rf "$build" "$ROOT/.devdata/gc1" "$ROOT/.devdata/gc2"
  mkdir -p "$build/wheels" "$ROOT/.devdata/gc1" "$ROOT/.devdata/gc2"
  pip download -q --no-deps -d "$build" "vllm==$VLLM" || return 1
  # shellcheck disable=SC2086
  pip download -q --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform any -d "$build/wheels" $DEPS \
    || return 1
  (cd "$build" && python3 -m zipfile -e vllm-$VLLM-*.whl unpacked) || return 1
  local so=$build/unpacked/vllm
  mv "$so/_C_stable_libtorch.abi3.so" "$build/"
  mv "$so/vllm_flash_attn/_vllm_fa3_C.abi3.so" "$build/"
  rm -f "$so"/vllm_flash_attn/_vllm_fa2_C.abi3.so "$so"/_moe_C_stable_libtorch.abi3.so "$so"/vllm-rs
  rm -rf "$so"/third_party/deep_gemm "$so"/third_party/fmha_sm100
  tar -C "$build/unpacked" -cf - . | xz -T2 -6 > "$ROOT/.devdata/gc1/vllm-py.tar.xz"
  xz -T2 -9 -c "$build/_vllm_fa3_C.abi3.so" > "$ROOT/.devdata/gc1/fa3.so.xz"
  tar -C "$build/wheels" -cf "$ROOT/.devdata/gc1/wheels.tar" .
  xz -T2 -9 -c "$build/_C_stable_libtorch.abi3.so" > "$ROOT/.devdata/gc2/c.so.xz"
  du -sh "$ROOT/.devdata/gc1" "$ROOT/.devdata/gc2"
}

need() {  # the file a stage needs, or one error naming the stage that writes it
  [ -f "$1" ] || { echo "gpu_check.sh: $1 is missing; it is written by '$2'" >&2; exit 2; }
}

unpack1() {
  need .devdata/gc1/vllm-py.tar.xz "gpu_check.sh stage (carried by the first call)"
  mkdir -p "$SITE" "$OUT"
  xz -dc .devdata/gc1/vllm-py.tar.xz | tar -C "$SITE" -xf -
  xz -dc .devdata/gc1/fa3.so.xz > "$SITE/vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so"
  mkdir -p "$W/wheels" && tar -C "$W/wheels" -xf .devdata/gc1/wheels.tar
  python3 -m pip install -q --no-index --no-deps --target "$SITE" "$W"/wheels/*.whl
  python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__, torch.cuda.get_device_name(0))"
}

run() {  # the check; DRY=1: on this CPU with the repository's own venv (the suite's dry-run path)
  mkdir -p "$OUT"
  if [ -n "${DRY:-}" ]; then
    "$ROOT/.venv/bin/python" "$ROOT/docs/bench/gpu_check.py" --dry-run --out "$OUT" ${CASES:+--cases "$CASES"}
    return
  fi
  need "$SITE/vllm/_C_stable_libtorch.abi3.so" "gpu_check.sh unpack2-and-run (the second call's part)"
  export PYTHONPATH=$SITE:$ROOT/src:$ROOT HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
  python3 -c "import vllm, swiftkv.vllm; print('vllm', vllm.__version__)" > "$OUT/import.log" 2>&1 || {
    tail -20 "$OUT/import.log"; return 1; }
  timeout "${LIMIT:-480}" python3 "$ROOT/docs/bench/gpu_check.py" --out "$OUT" 2>&1 | tail -c 20000 > "$OUT/run.log"
  cat "$OUT/gpu-check.md" 2>/dev/null
}

case $stage in
  stage) stage ;;
  stash|unstash) PYTHONPATH=$ROOT/src "$ROOT/.venv/bin/python" -m swiftkv.cli loan "$stage" ;;
  unpack1) unpack1 ;;
  unpack2-and-run)
    need .devdata/gc2/c.so.xz "gpu_check.sh stage (carried by the second call)"
    xz -dc .devdata/gc2/c.so.xz > "$SITE/vllm/_C_stable_libtorch.abi3.so" && run ;;
  run) run ;;
  *) echo "gpu_check.sh: unknown stage $stage (stage, stash, unstash, unpack1, unpack2-and-run, run)" >&2; exit 2 ;;
esac
