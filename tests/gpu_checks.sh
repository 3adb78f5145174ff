#!/usr/bin/env bash
# Every GPU check, for the device machine:
#   bash tests/gpu_checks.sh [parity|pytest|deltas|steptime|capabilities|multigpu|all]...
# (multigpu: test_multi_gpu.py, test_multi_rank_gpu.py, test_ipc_gpu.py and vmm_costs --peers; the
# scenarios that need 2 or 4 GPUs skip on fewer, saying so)
# Builds the library in build-gpu/ (Release), then runs the selected checks;
# each writes its output to $OUT (default: build-gpu/out) as well as stdout.
# The C++ bridge is built by the first check that installs torchalloc (into
# the per-user cache, see python/torchalloc/bridge.py); its build time is in
# bridge-build.txt. Without a CUDA GPU nothing runs: it says so and exits 2.
set -uo pipefail
cd "$(dirname "$0")/.."
checks=("$@")
((${#checks[@]})) || checks=(all)
out=${OUT:-build-gpu/out}
lib=$PWD/build-gpu/libtorchalloc.so
export TORCHALLOC_LIB=$lib PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
status=0

if ! python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  echo "gpu_checks.sh: no CUDA GPU visible to torch here (or no torch): NOTHING RAN"
  exit 2
fi
mkdir -p "$out"
if [ ! -f "$lib" ] || [ -n "$(find allocator include -newer "$lib" -name '*.[ch]' | head -1)" ]; then
  cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DTORCHALLOC_TESTS=OFF >/dev/null && cmake --build build-gpu -j >/dev/null || {
    echo "build failed"; exit 1; }
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
python3 -c "import torch; print('torch', torch.__version__)" | tee -a "$out/gpu.txt"

# Build the bridge once, up front, and time it (later installs load it from the cache).
python3 - <<'EOF' 2>&1 | tee "$out/bridge-build.txt"
import time
from torchalloc import bridge
t0 = time.perf_counter()
found = bridge.find_or_build()
print(f"bridge: {found.path} ({'built in %.1f s' % found.build_seconds if found.built_now else 'already built'}; "
      f"found in {time.perf_counter() - t0:.2f} s)")
t0 = time.perf_counter()
bridge.find_or_build()
print(f"bridge: a later start finds it in {time.perf_counter() - t0:.3f} s without rebuilding")
EOF

run() { # name, command...
  local name=$1; shift
  echo "=== $name: $*"
  local t0=$SECONDS
  "$@" > >(tee "$out/$name.txt") 2>&1 || { echo "=== $name FAILED"; status=1; }
  echo "=== $name took $((SECONDS - t0))s"
}

wants() { local c; for c in "${checks[@]}"; do [[ $c == "$1" || $c == all ]] && return 0; done; return 1; }

if wants parity; then
  # caching and phase_arena: the default (expandable:reclaim); caching+off: PyTorch's segments; +compact, +on.
  policies=caching,caching+off,caching+on,caching+compact,exact,phase_arena
  run parity-plain python3 examples/train_parity.py --lib "$lib" --route plain --policies "$policies"
  run parity-bridge python3 examples/train_parity.py --lib "$lib" --route bridge --policies "$policies"
fi
wants pytest && run pytest python3 -m pytest -q -rs python/tests
wants deltas && run deltas python3 examples/allocated_deltas.py
wants capabilities && run capabilities python3 examples/capabilities.py --lib "$lib" --json "$out/capabilities.json"
if wants multigpu; then
  # Every test of several streams, GPUs and processes (each scenario with its own timeout; the two- and
  # four-GPU ones skip with the reason on fewer GPUs), then what granting a peer costs the driver.
  run multigpu-one-process timeout 1200 python3 -m pytest -q -rs python/tests/test_multi_gpu.py
  run multigpu-ranks timeout 2400 python3 -m pytest -q -rs python/tests/test_multi_rank_gpu.py
  run multigpu-ipc timeout 1200 python3 -m pytest -q -rs python/tests/test_ipc_gpu.py
  gpus=$(python3 -c 'import torch; print(torch.cuda.device_count())')
  if ((gpus >= 2)); then
    gcc -O2 -std=c11 bench/vmm_costs.c -I/usr/local/cuda/include -L/usr/local/cuda/lib64/stubs -lcuda \
      -o build-gpu/vmm_costs && run vmm-costs-peers build-gpu/vmm_costs --peers
  else
    echo "SKIP vmm_costs --peers: needs 2 GPUs, found $gpus" | tee "$out/vmm-costs-peers.txt"
  fi
fi
wants steptime && run steptime python3 bench/step_time.py --lib "$lib" \
  --variants native,caching,caching+bridge,exact+bridge,phase_arena+bridge,caching+log+bridge,caching+stacks+bridge --rounds 2
exit $status
