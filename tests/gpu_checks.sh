#!/usr/bin/env bash
# Every GPU check, for the device machine: bash tests/gpu_checks.sh [parity|pytest|deltas|steptime|all]
# Builds the library in build-gpu/ (Release), then runs the selected checks;
# each writes its output to $OUT (or ./gpu-out) as well as stdout.
set -uo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
out=${OUT:-gpu-out}
mkdir -p "$out"
lib=$PWD/build-gpu/libtorchalloc.so
export TORCHALLOC_LIB=$lib
status=0

if [ ! -f "$lib" ] || [ -n "$(find allocator policies -newer "$lib" -name '*.[ch]' | head -1)" ]; then
  cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DTORCHALLOC_TESTS=OFF >/dev/null && cmake --build build-gpu -j >/dev/null || {
    echo "build failed"; exit 1; }
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
python3 -c "import torch; print('torch', torch.__version__)" | tee -a "$out/gpu.txt"

run() { # name, command...
  local name=$1; shift
  echo "=== $name: $*"
  local t0=$SECONDS
  "$@" > >(tee "$out/$name.txt") 2>&1 || { echo "=== $name FAILED"; status=1; }
  echo "=== $name took $((SECONDS - t0))s"
}

case $what in parity|all) run parity python3 examples/train_parity.py --lib "$lib" --policies caching,exact,phase_arena ;; esac
case $what in pytest|all) run pytest python3 -m pytest -q -rs python/tests ;; esac
case $what in deltas|all) run deltas python3 examples/allocated_deltas.py ;; esac
case $what in steptime|all)
  run steptime python3 bench/step_time.py --lib "$lib" --variants native,caching,exact,phase_arena,caching+log,caching+stacks --rounds 2 ;;
esac
exit $status
