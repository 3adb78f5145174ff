#!/usr/bin/env bash
# The one test command (run from the repository root):   bash tests/run.sh
#
# Builds and runs every C test (ctest) in three configurations:
#   build/        Release
#   build-asan/   -DTORCHALLOC_SANITIZE=address,undefined
#   build-tsan/   -DTORCHALLOC_SANITIZE=thread
# builds with clang -Werror and ASan+UBSan in build-clang/ and runs ctest
# there too when clang is there (its UBSan checks things gcc's does not), then
# runs the fuzzers for FUZZ_SECONDS each (fuzz_api under libFuzzer with clang,
# in build-fuzz/; fuzz_log_decode.py; fuzz_snapshot.py a third as long) in the
# background while python/tests runs with pytest. pytest runs on every core
# (pytest-xdist) with the Release build's library. Before anything is built it
# finds a Python that can run the Python suite: python3 itself when it imports
# numpy, pytest, pytest-xdist and setuptools' bdist_wheel (setup.py's test
# extra), else the venv build-py/test-venv, made and filled once with the
# README's install command and the test extra (pip install '.[test]'; in the
# background while the Release stage builds) -- a fresh machine needs only
# Python, a compiler and cmake. Stops at the first failure. Each stage says
# its wall time and the CPU time (user + sys) of what it ran, so a slow stage
# can be told from a busy machine. At the end it lists the tests skipped, by
# reason (a stage skipped, pytest's skips), and says loudly when the browser
# tests (the HTML report in headless Chromium) did not run. The last line of
# output is always "N passed, N failed": test cases summed over every ctest
# run (each program prints its own such line) and pytest.
#
# Environment: JOBS (parallel jobs, default: all cores), SKIP_SANITIZERS=1
# (Release only, for a quick local loop), FUZZ_SECONDS (default 30; 0 skips
# the fuzzers).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
JOBS=${JOBS:-$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2)}
export CTEST_OUTPUT_ON_FAILURE=1
# Sanitizers: stop at the first report, with a stack.
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1:strict_string_checks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}

PASSED=0
FAILED=0
TIMES=()
RUN_TMP=$(mktemp -d)  # scratch: the stages' CPU times
SKIPS=()  # "COUNT<TAB>REASON": a stage or pytest's tests skipped, and why
SUMMARY_PRINTED=0
ERR_LINE=?

# skipped COUNT REASON: say it now, and again in the summary.
skipped() {
  SKIPS+=("$1"$'\t'"$2")
  echo "== skipped: $2"
}

summary() {
  if ((${#SKIPS[@]})); then
    echo "== skipped, by reason:"
    printf '%s\n' "${SKIPS[@]}" | awk -F'\t' '{ n[$2] += $1 } END { for (r in n) printf "==   %5d  %s\n", n[r], r }' |
      sort -k2,2nr
    local browser
    browser=$(printf '%s\n' "${SKIPS[@]}" | awk -F'\t' '$2 ~ /^no chromium/ { n += $1 } END { print n + 0 }')
    if ((browser > 0)); then
      echo "run.sh: WARNING: THE $browser BROWSER TESTS DID NOT RUN (the HTML report in headless Chromium):" \
        "install chromium (apt-get install chromium; .ci/run does) and run again"
    fi
  fi
  echo "$PASSED passed, $FAILED failed"
  SUMMARY_PRINTED=1
}

# Anything that fails outside the checks below still ends with a message and
# the summary line.
trap 'ERR_LINE=$LINENO' ERR
trap 'rc=$?; if ((rc != 0 && SUMMARY_PRINTED == 0)); then
        echo "run.sh: FAILED: unexpected error (exit $rc, line $ERR_LINE)"; ((FAILED += 1)) || true; summary
      fi
      [[ -z ${SETUP_PID:-} ]] || wait "$SETUP_PID" 2>/dev/null || true  # a failure before setup ended: let pip finish
      rm -rf "$RUN_TMP"' EXIT

# fail STAGE MESSAGE [LOG]: print why (and the log's tail), then the summary; exit 1.
fail() {
  local stage=$1 msg=$2 log=${3:-}
  if [[ -n $log && -f $log ]]; then
    echo "---- errors in $log ----"
    grep -E -m 20 'error|Error|CMake Error' "$log" || true
    echo "---- last lines of $log ----"
    tail -n 40 "$log"
    echo "----"
  fi
  echo "run.sh: FAILED in $stage: $msg"
  ((FAILED += 1)) || true
  summary
  exit 1
}

# cs("1m2.345s"): the hundredths of a second in one of `times`' figures.
AWK_CS='function cs(f, m) { m = f; sub(/m.*/, "", m); sub(/^[0-9]+m/, "", f); sub(/s$/, "", f)
                          return int((m * 60 + f) * 100 + 0.5) }'

# CPU time (user + sys, in hundredths of a second) of this shell's children
# that have ended, as bash's `times` counts it (its second line), less what
# the background jobs (setup, fuzzers) used: each writes its own `times` to
# $RUN_TMP/bg-*.times as it ends, so a stage is not charged for one that
# happened to end during it. Sets CPU_NOW (a command substitution would run
# `times` in a subshell, which has no children).
cpu_now() {
  times >"$RUN_TMP/times"
  local f bg=()
  for f in "$RUN_TMP"/bg-*.times; do [[ -f $f ]] && bg+=("$f"); done
  CPU_NOW=$(awk -v main="$RUN_TMP/times" "$AWK_CS"'
    FILENAME == main && FNR == 2 { total += cs($1) + cs($2) }
    FILENAME != main && FNR <= 2 { bg += cs($1) + cs($2) }
    END { print total - bg }' "$RUN_TMP/times" ${bg[@]+"${bg[@]}"})
}

# stage_done STAGE START_SECONDS [START_CPU]: record and print the stage's wall (and CPU) time.
stage_done() {
  local t=$((SECONDS - $2)) cpu=
  if [[ -n ${3:-} ]]; then
    cpu_now
    cpu=", $(((CPU_NOW - $3 + 50) / 100))s CPU"
  fi
  TIMES+=("$1 ${t}s${cpu:+ (${cpu#, })}")
  echo "== $1: ok (${t}s${cpu})"
}

# configure_and_build STAGE DIR [cmake args...]; BUILD_TARGET=T builds T only.
configure_and_build() {
  local stage=$1 dir=$2
  shift 2
  local log="$dir/run-build.log"
  mkdir -p "$dir"
  echo "== $stage: configure and build in $dir/"
  if ! cmake -S "$ROOT" -B "$dir" "$@" >"$log" 2>&1; then fail "$stage" "cmake configure failed" "$log"; fi
  if ! cmake --build "$dir" -j "$JOBS" ${BUILD_TARGET:+--target "$BUILD_TARGET"} >>"$log" 2>&1; then
    fail "$stage" "build failed" "$log"
  fi
}

# Adds the "N passed, N failed" lines the test programs printed in the last
# ctest run of DIR; a program that failed without its line (a crash, a
# sanitizer abort) counts as one failure.
count_ctest() {
  local log="$1/Testing/Temporary/LastTest.log"
  [[ -f $log ]] || return 0
  local counts
  counts=$(awk '
    /^[0-9]+\/[0-9]+ Testing: / { have = 0; p = 0; f = 0 }
    /^[0-9]+ passed, [0-9]+ failed$/ { have = 1; p = $1; f = $3 }
    /^Test Passed\./ { P += p; F += f }
    /^Test Failed\./ || /^Test (Timeout|Not Run)/ || /\*\*\*Exception/ {
      P += p; F += (have && f > 0) ? f : f + 1
    }
    END { printf "%d %d\n", P, F }' "$log")
  PASSED=$((PASSED + ${counts% *}))
  FAILED=$((FAILED + ${counts#* }))
}

# run_ctest STAGE DIR [prefix command...]: ctest in DIR, output in DIR/run-ctest.log.
run_ctest() {
  local stage=$1 dir=$2
  shift 2
  local log="$dir/run-ctest.log"
  echo "== $stage: ctest"
  local rc=0
  (cd "$dir" && "$@" ctest --output-on-failure -j "$JOBS" --timeout 900) >"$log" 2>&1 || rc=$?
  return $rc
}

# A failed ctest: count, show, stop.
ctest_failed() { # STAGE DIR
  count_ctest "$2"
  ((FAILED > 0)) || FAILED=1
  echo "---- $2/run-ctest.log ----"
  cat "$2/run-ctest.log"
  echo "----"
  echo "run.sh: FAILED in $1: ctest reported failures (see above; rerun one program from $2/tests/)"
  summary
  exit 1
}

# bg_done TIMES_FILE: what a background job writes as it ends: its `times` (its own CPU and its children's)
# and when it ended ($SECONDS).
bg_done() { { times; echo "$SECONDS"; } >"$1"; }

# stage_done_bg STAGE START_SECONDS TIMES_FILE: stage_done for a background job that bg_done'd TIMES_FILE.
stage_done_bg() {
  local t cpu
  read -r t cpu < <(awk "$AWK_CS"'NR <= 2 { c += cs($1) + cs($2) } NR == 3 { end = $1 }
                                  END { printf "%d %d\n", end - '"$2"', (c + 50) / 100 }' "$3")
  TIMES+=("$1 ${t}s (${cpu}s CPU)")
  echo "== $1: ok (${t}s, ${cpu}s CPU)"
}

# --------------------------------------------------------------------------
# 0. A Python that can run python/tests, found first. When it must be made
#    (a venv, from PyPI), that runs in the background while the Release
#    stage builds, and the run waits for it right after that stage: a
#    machine that cannot have one fails then, not after minutes of builds
#    and fuzzing.
# --------------------------------------------------------------------------
command -v python3 >/dev/null || fail prerequisites "python3 is not installed (python/tests and the log fuzzer need it)"
# numpy (the package's dependency), pytest, pytest-xdist (the suite on every core) and setuptools >= 70.1 (the
# test extra: its bdist_wheel for the wheel's tag).
can_run_the_suite() {
  "$1" -c 'import numpy, pytest, xdist; from setuptools.command.bdist_wheel import bdist_wheel' >/dev/null 2>&1
}
PYTHON=python3
SETUP_PID=
# The venv, in the background; the exit status says what failed (10 the venv, 11 pip).
make_venv() {
  rm -rf "$venv"
  python3 -m venv "$venv" >build-py/run-setup.log 2>&1 || exit 10
  "$venv/bin/python" -m pip install -q --disable-pip-version-check '.[test]' >>build-py/run-setup.log 2>&1 || exit 11
  bg_done "$RUN_TMP/bg-setup.times"
}
# Wait for make_venv, if it runs; stop the run if it failed.
finish_setup() {
  [[ -n $SETUP_PID ]] || return 0
  local rc=0
  wait "$SETUP_PID" || rc=$?
  SETUP_PID=
  case $rc in
    0) stage_done_bg "setup (beside release)" "$SETUP_T0" "$RUN_TMP/bg-setup.times" ;;
    10) fail setup "python3 -m venv failed: install python3-venv (apt-get install python3-venv)" build-py/run-setup.log ;;
    *) fail setup "pip install '.[test]' into $venv failed (it needs PyPI)" build-py/run-setup.log ;;
  esac
}
if ! can_run_the_suite python3; then
  venv=build-py/test-venv
  PYTHON=$ROOT/$venv/bin/python
  if ! can_run_the_suite "$venv/bin/python"; then
    mkdir -p build-py
    echo "== setup: python3 cannot import numpy, pytest, pytest-xdist and setuptools >= 70.1: making $venv/" \
      "with pip install '.[test]' (once; later runs reuse it), in the background while Release builds"
    SETUP_T0=$SECONDS
    make_venv &
    SETUP_PID=$!
  fi
fi

# --------------------------------------------------------------------------
# 1. Release
# --------------------------------------------------------------------------
t0=$SECONDS; cpu_now; c0=$CPU_NOW
configure_and_build release build -DCMAKE_BUILD_TYPE=Release -DTORCHALLOC_SANITIZE=
run_ctest release build || ctest_failed release build
count_ctest build
stage_done release "$t0" "$c0"
finish_setup

if [[ ${SKIP_SANITIZERS:-0} != 1 ]]; then
  # ------------------------------------------------------------------------
  # 2. ASan + UBSan
  # ------------------------------------------------------------------------
  t0=$SECONDS; cpu_now; c0=$CPU_NOW
  configure_and_build asan+ubsan build-asan -DTORCHALLOC_SANITIZE=address,undefined
  run_ctest asan+ubsan build-asan || ctest_failed asan+ubsan build-asan
  count_ctest build-asan
  stage_done asan+ubsan "$t0" "$c0"

  # ------------------------------------------------------------------------
  # 3. TSan. Some kernels map memory where TSan does not expect it ("FATAL:
  #    ThreadSanitizer: unexpected memory mapping"): retry with ASLR off.
  # ------------------------------------------------------------------------
  t0=$SECONDS; cpu_now; c0=$CPU_NOW
  configure_and_build tsan build-tsan -DTORCHALLOC_SANITIZE=thread
  if ! run_ctest tsan build-tsan; then
    if grep -q "unexpected memory mapping" build-tsan/run-ctest.log && command -v setarch >/dev/null; then
      echo "== tsan: 'unexpected memory mapping': retrying with ASLR off (setarch $(uname -m) -R)"
      run_ctest tsan build-tsan setarch "$(uname -m)" -R || ctest_failed tsan build-tsan
    else
      ctest_failed tsan build-tsan
    fi
  fi
  count_ctest build-tsan
  stage_done tsan "$t0" "$c0"
fi

# --------------------------------------------------------------------------
# 4. clang -Werror with ASan + UBSan (clang's UBSan also checks array bounds
#    inside structs, which gcc's does not)
# --------------------------------------------------------------------------
if command -v clang >/dev/null; then
  t0=$SECONDS; cpu_now; c0=$CPU_NOW
  CC=clang configure_and_build clang build-clang -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DTORCHALLOC_SANITIZE=address,undefined -DCMAKE_C_COMPILER=clang -DCMAKE_C_FLAGS=-Werror
  if [[ ${SKIP_SANITIZERS:-0} != 1 ]]; then
    run_ctest clang build-clang || ctest_failed clang build-clang
    count_ctest build-clang
  fi
  stage_done "clang -Werror asan+ubsan" "$t0" "$c0"
else
  skipped 1 "clang stage: clang is not installed"
fi

# --------------------------------------------------------------------------
# 5. Fuzzing, FUZZ_SECONDS each: fuzz_api (libFuzzer: the C API on the sim
#    device, the full check after every operation; clang with ASan+UBSan) on
#    a scratch copy of the committed corpus, fuzz_log_decode.py (a mutation
#    fuzzer of the log decoder) and fuzz_snapshot.py (a third as long). Each
#    counts as one test. fuzz_api is built here; the fuzzers then run one
#    after another in the background while pytest (stage 6) runs. A fuzzer's
#    run is bounded by wall time, and pytest keeps both cores busy, so the
#    fuzzers cost the run the CPU they take from it: about 2/3 of a core for
#    their 2 1/3 x FUZZ_SECONDS. 30 s each was measured to be past the knee
#    (2026-11-28, this corpus): fuzz_api starts at the 2,877 edges its corpus
#    reaches and found its last new ones (2,889) within 1,600 executions of a
#    60 s run (2,500 executions, on a busy machine); the decoder fuzzer's lines
#    covered grew by 11 of ~5,700 from 30 s to 60 s, the snapshot fuzzer's by
#    none from 10 s to 20 s.
#    Longer hunts: FUZZ_SECONDS=600, or fuzz_api by hand (tests/fuzz/).
# --------------------------------------------------------------------------
FUZZ_SECONDS=${FUZZ_SECONDS:-30}
FUZZ_API=0  # 1: fuzz_api was built and runs
FUZZ_PID=
FUZZ_T0=
snapshot_seconds=$(( FUZZ_SECONDS / 3 > 0 ? FUZZ_SECONDS / 3 : 1 ))

# The fuzzers one after another; the exit status says which failed first (10 fuzz_api, 11 decoder, 12 snapshot).
run_fuzzers() {
  if ((FUZZ_API)); then
    build-fuzz/tests/fuzz_api -max_total_time="$FUZZ_SECONDS" -max_len=4096 -print_final_stats=1 \
      -artifact_prefix=build-fuzz/ build-fuzz/corpus-api >build-fuzz/run-fuzz-api.log 2>&1 || return 10
  fi
  "$PYTHON" tests/fuzz/fuzz_log_decode.py --seconds "$FUZZ_SECONDS" --save build >build/run-fuzz-decode.log 2>&1 ||
    return 11
  "$PYTHON" tests/fuzz/fuzz_snapshot.py --seconds "$snapshot_seconds" --save build >build/run-fuzz-snapshot.log 2>&1 ||
    return 12
  bg_done "$RUN_TMP/bg-fuzz.times"
}

# Wait for the fuzzers; print what they found; count them. Returns 1 (after saying why) when one failed.
finish_fuzzers() {
  [[ -n $FUZZ_PID ]] || return 0
  local rc=0
  wait "$FUZZ_PID" || rc=$?
  FUZZ_PID=
  if ((FUZZ_API && rc != 10)); then
    grep -E '^(Done [0-9]+ runs|fuzz_api: )' build-fuzz/run-fuzz-api.log | sed 's/^/== fuzz_api: /'
    grep -E '^#[0-9]+.*cov: ' build-fuzz/run-fuzz-api.log | tail -n 1 | sed 's/^/== fuzz_api: last: /'
  fi
  ((rc == 0 || rc > 11)) && sed 's/^/== /' build/run-fuzz-decode.log
  ((rc == 0)) && sed 's/^/== /' build/run-fuzz-snapshot.log | tail -n 5
  local log why
  case $rc in
    0) PASSED=$((PASSED + FUZZ_API + 2)); stage_done_bg "fuzz (beside pytest)" "$FUZZ_T0" "$RUN_TMP/bg-fuzz.times"
       return 0 ;;
    10) log=build-fuzz/run-fuzz-api.log
        why="fuzz_api: a violation or a crash (input saved as build-fuzz/crash-*; replay it with build-fuzz/tests/fuzz_api FILE)" ;;
    11) log=build/run-fuzz-decode.log why="fuzz_log_decode: an input neither decoded nor raised LogFormatError in time" ;;
    12) log=build/run-fuzz-snapshot.log why="fuzz_snapshot: a snapshot neither loaded nor was refused with one clear error in time" ;;
    *) log= why="the fuzzers stopped with exit $rc" ;;
  esac
  if [[ -n $log ]]; then
    echo "---- last lines of $log ----"
    tail -n 40 "$log"
    echo "----"
  fi
  echo "run.sh: FAILED in fuzz: $why"
  ((FAILED += 1)) || true
  return 1
}

if ((FUZZ_SECONDS > 0)); then
  t0=$SECONDS; cpu_now; c0=$CPU_NOW
  mkdir -p build-fuzz
  probe=build-fuzz/libfuzzer-probe
  printf '%s\n' '#include <stddef.h>' '#include <stdint.h>' \
    'int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }' >"$probe.c"
  if ! command -v clang >/dev/null; then
    skipped 1 "fuzz_api: clang is not installed (libFuzzer comes with clang)"
  elif ! clang -fsanitize=fuzzer,address,undefined "$probe.c" -o "$probe" >"$probe.log" 2>&1; then
    skipped 1 "fuzz_api: $(clang --version | head -n1) cannot link -fsanitize=fuzzer (no libFuzzer runtime): $(head -n 1 "$probe.log")"
  else
    CC=clang BUILD_TARGET=fuzz_api configure_and_build fuzz_api build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DCMAKE_C_COMPILER=clang -DTORCHALLOC_SANITIZE=address,undefined -DTORCHALLOC_FUZZ=ON -DCMAKE_C_FLAGS=-Werror
    mkdir -p build-fuzz/corpus-api
    cp -n tests/fuzz/corpus/api/* tests/fuzz/corpus/api-found/* build-fuzz/corpus-api/
    FUZZ_API=1
    stage_done "fuzz_api build" "$t0" "$c0"
  fi
  echo "== fuzz: in the background while pytest runs:" \
    "$( ((FUZZ_API)) && echo "fuzz_api -max_total_time=$FUZZ_SECONDS build-fuzz/corpus-api ($(ls build-fuzz/corpus-api | wc -l) inputs),")" \
    "fuzz_log_decode.py --seconds $FUZZ_SECONDS, fuzz_snapshot.py --seconds $snapshot_seconds"
  FUZZ_T0=$SECONDS
  run_fuzzers &
  FUZZ_PID=$!
else
  skipped 3 "the fuzzers: FUZZ_SECONDS=0"
fi

# --------------------------------------------------------------------------
# 6. Python tests (the fuzzers running beside them)
# --------------------------------------------------------------------------
# $PYTHON was found (or made) at the start (stage 0). -rs: a line for each skip, with its reason, summed below.
# -n: on every core (pytest-xdist). The library is the Release build's (conftest.py would otherwise build its
# own copy in build-py/, in each worker).
t0=$SECONDS; cpu_now; c0=$CPU_NOW
pytest_args=(-q -rs)
((JOBS > 1)) && pytest_args+=(-n "$JOBS")
export TORCHALLOC_LIB=${TORCHALLOC_LIB:-$ROOT/build/libtorchalloc.so}
echo "== pytest: $PYTHON -m pytest ${pytest_args[*]} python/tests (TORCHALLOC_LIB=$TORCHALLOC_LIB)"
log=build/run-pytest.log
rc=0
PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -m pytest "${pytest_args[@]}" python/tests 2>&1 |
  tee "$log" || rc=${PIPESTATUS[0]}
# "SKIPPED [3] python/tests/test_report_page.py:313: REASON" -> "3<TAB>REASON"
while IFS=$'\t' read -r n reason; do SKIPS+=("$n"$'\t'"$reason"); done < <(
  sed -n 's/^SKIPPED \[\([0-9]*\)\] [^ ]*:[0-9]*: \(.*\)$/\1\t\2/p' "$log")
# Counts from pytest's last line, e.g. "3 failed, 12 passed, 1 skipped in 0.52s".
counts=$(grep -E '[0-9]+ (passed|failed|errors?)' "$log" | tail -n 1 | awk '{
    for (i = 2; i <= NF; i++) {
      w = $i; gsub(/[^a-z]/, "", w); n = $(i - 1) + 0
      if (w == "passed") p += n
      else if (w == "failed" || w == "error" || w == "errors") f += n
    }
  } END { printf "%d %d\n", p, f }' || true)
counts=${counts:-0 0}
PASSED=$((PASSED + ${counts% *}))
FAILED=$((FAILED + ${counts#* }))
if ((rc != 0)); then
  ((FAILED > 0)) || FAILED=1
  echo "run.sh: FAILED in pytest: exit code $rc (see above)"
else
  stage_done pytest "$t0" "$c0"
fi
fuzz_ok=1
finish_fuzzers || fuzz_ok=0
if ((rc != 0 || fuzz_ok == 0)); then
  summary
  exit 1
fi

echo "== times: $(printf '%s; ' "${TIMES[@]}" | sed 's/; $//')"
summary
