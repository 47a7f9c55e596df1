#!/bin/bash
# The serving check (gpu_check.py: SwiftKV under vLLM's engine, case by case against the HF model, on tiny
# random checkpoints) on a GPU machine with torch 2.11 + cu130, Python 3.12 and transformers but no vLLM and
# no network: vLLM 0.26.0 (its CUDA 13 wheel pins that torch) is staged here in two parts of at most PART_MIB
# each, unpacked there, then gpu_check.py runs every case and writes gpu-check.json and gpu-check.md under
# $OUT as it goes (with run.log and import.log: at most 8 files, outputs.py's limits).
#
# Steps, each run from the repository root:
#   bash scripts/gpu/gpu_check.sh stage             # here, with network: .devdata/gc1 and .devdata/gc2
#   bash scripts/gpu/gpu_check.sh unpack1           # on the GPU, with .devdata/gc1: vLLM's Python side into $W
#   bash scripts/gpu/gpu_check.sh unpack2-and-run   # on the GPU, with .devdata/gc2: its kernels, then the check
#   bash scripts/gpu/gpu_check.sh run               # on a GPU machine that has vLLM already: the check alone
#   DRY=1 PYTHON=... bash scripts/gpu/gpu_check.sh run   # the CPU's cases with the given Python (the suite)
# Exit codes: 0 every case passed, 1 a case failed, 2 a staged file is missing (named, with the step that
# writes it), 3 `from vllm import LLM` (or swiftkv's plugin) does not import: nothing ran, 4 $OUT breaks
# outputs.py's limits.
#
# Part 1: vLLM's Python sources, its FlashAttention-3 library and the small packages vLLM imports that such a
# machine lacks. Part 2: vLLM's `_C_stable_libtorch` kernels. Left out (size): FlashAttention-2 (Hopper runs
# FA3), the MoE kernels, numba (so the ngram case records an import error there). Sizes (2026-11-26): part 1
# 32 MB, part 2 54 MB.
set -uo pipefail
stage=$1
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
W=${W:-${TMPDIR:-/tmp}/swiftkv-gpu-check}  # the GPU machine's work folder, outside the checkout
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
PART_MIB=60  # the most one upload to the GPU machine carried beside the checkout (a setting of that machine)
SITE=$W/site
OUT=${OUT:-$W/out}
VLLM=0.26.0
# What vLLM 0.26 imports beyond torch and transformers (read from its sources, 2026-11-26), at
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
  for part in gc1 gc2; do
    local mib=$(( $(du -sb "$ROOT/.devdata/$part" | cut -f1) / 1048576 ))
    [ "$mib" -le "$PART_MIB" ] || { echo "gpu_check.sh: .devdata/$part is $mib MiB, more than PART_MIB $PART_MIB" >&2; return 1; }
  done
}

need() {  # the file a stage needs, or one error naming the stage that writes it
  [ -f "$1" ] || { echo "gpu_check.sh: $1 is missing; it is written by '$2'" >&2; exit 2; }
}

unpack1() {
  need .devdata/gc1/vllm-py.tar.xz "gpu_check.sh stage (part 1)"
  mkdir -p "$SITE" "$OUT"
  xz -dc .devdata/gc1/vllm-py.tar.xz | tar -C "$SITE" -xf -
  xz -dc .devdata/gc1/fa3.so.xz > "$SITE/vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so"
  mkdir -p "$W/wheels" && tar -C "$W/wheels" -xf .devdata/gc1/wheels.tar
  python3 -m pip install -q --no-index --no-deps --target "$SITE" "$W"/wheels/*.whl
  python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__, torch.cuda.get_device_name(0))"
}

run() {  # the check; DRY=1: on this CPU with $PYTHON (the suite's dry-run path)
  mkdir -p "$OUT"
  if [ -n "${DRY:-}" ]; then
    # exec: the check is this process, so whoever stops the script stops the check
    exec "$PYTHON" "$HERE/gpu_check.py" --dry-run --out "$OUT" ${CASES:+--cases "$CASES"}
  fi
  [ -d "$SITE" ] && export PYTHONPATH=$SITE:$ROOT/src:$ROOT || export PYTHONPATH=$ROOT/src:$ROOT
  export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
  python3 -c "from vllm import LLM; import vllm, swiftkv.vllm; print('vllm', vllm.__version__)" > "$OUT/import.log" 2>&1 || {
    echo "gpu_check.sh: vLLM or swiftkv's plugin does not import; nothing ran:" >&2; tail -20 "$OUT/import.log" >&2; return 3; }
  timeout "${LIMIT:-480}" python3 "$HERE/gpu_check.py" --out "$OUT" > "$OUT/run.log.tmp" 2>&1
  local code=$?
  tail -c 20000 "$OUT/run.log.tmp" > "$OUT/run.log" && rm -f "$OUT/run.log.tmp"
  cat "$OUT/gpu-check.md" 2>/dev/null
  return $code
}

case $stage in
  stage) stage ;;
  unpack1) unpack1 ;;
  unpack2-and-run)
    need .devdata/gc2/c.so.xz "gpu_check.sh stage (part 2)"
    need "$SITE/vllm/__init__.py" "gpu_check.sh unpack1"
    xz -dc .devdata/gc2/c.so.xz > "$SITE/vllm/_C_stable_libtorch.abi3.so" && run ;;
  run) run ;;
  *) echo "gpu_check.sh: unknown step $stage (stage, unpack1, unpack2-and-run, run)" >&2; exit 2 ;;
esac
