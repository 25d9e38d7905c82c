#!/usr/bin/env bash
# The test suite under AddressSanitizer + UndefinedBehaviorSanitizer (+ LeakSanitizer):
# set up as scripts/test.sh does, build convnets and its tests with gcc's
# -fsanitize=address,undefined into build-asan/ (git-ignored; setup.sh's CMake
# line, plus the flags below), run CTest there. Fails on a failing test and on
# any sanitizer report, also one from a process a test expected to fail.
#
#   scripts/sanitize.sh                 the GoogleTest suites and the CLI tests
#   scripts/sanitize.sh -R '^Models\.'  extra arguments go to ctest
#
# LibTorch, Python and the other libraries are not instrumented: only
# convnets' own code is checked, and the options below keep their memory from
# being reported as ours.
set -euo pipefail
cd "$(dirname "$0")/.."
build=build-asan
logs=$PWD/$build/sanitizer-logs

# -O1: fast enough for the training tests, and every report still has a
# stack with lines (-g1). _GLIBCXX_ASSERTIONS bounds-checks the standard
# containers, in place of ASan's container annotations (see ASAN_OPTIONS).
flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"

# The test executables run during the build too (gtest_discover_tests lists
# their tests), so the runtime options are set before it.
# detect_container_overflow=0: vectors are filled and resized on both sides
#   of the boundary with LibTorch (e.g. IValue lists, sizes), and annotations
#   made by instrumented code are not kept up to date by uninstrumented code,
#   which gives false container-overflow reports. libstdc++ annotates only with
#   _GLIBCXX_SANITIZE_VECTOR, which we do not define; this keeps it so.
# protect_shadow_gap=0: the CUDA driver (libcuda, uninstrumented) maps memory
#   in the range ASan would reserve as the shadow gap; without it a GPU run
#   fails at CUDA's initialisation. It costs nothing on a machine without one.
# allocator_may_return_null=1: an allocation too large for ASan's allocator
#   (> 1 TiB, or more than the machine has) fails as it does without ASan
#   (std::bad_alloc, or c10's out-of-memory error, which convnets reports)
#   instead of ending the process with an allocation-size-too-big report.
# log_path: every ASan and LSan report of every process (also of a convnets
#   that a CLI test expected to exit non-zero) goes to a file, checked after
#   the run. gcc's UBSan is a runtime of its own (libubsan) whose start-up sets
#   the report path of the ASan runtime to UBSAN_OPTIONS' log_path ("stderr"
#   when unset), hence the same path in both; its own reports still go to
#   stderr, where the failing test shows them (they end the process:
#   -fno-sanitize-recover).
rm -rf "$logs"
mkdir -p "$logs"
export ASAN_OPTIONS="detect_container_overflow=0:protect_shadow_gap=0:allocator_may_return_null=1:check_initialization_order=1:strict_init_order=1:log_path=$logs/asan"
export UBSAN_OPTIONS="print_stacktrace=1:log_path=$logs/asan"
# Leaks: only allocations made entirely by third-party code are suppressed (the file says which).
# Tests that check what a sanitizer changes (std::bad_alloc) skip on it.
export CONVNETS_SANITIZER=address,undefined
export LSAN_OPTIONS="suppressions=$PWD/scripts/lsan.supp:print_suppressions=0"

reports() {  # print every sanitizer report; true if there was one
  local found=1 f
  for f in "$logs"/*; do
    [[ -e $f ]] || continue
    if grep -qE 'ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:' "$f"; then
      echo "=== sanitizer report: $f"
      cat "$f"
      found=0
    fi
  done
  return $found
}

start=$SECONDS
status=0
CONVNETS_BUILD_TYPE=Debug ./scripts/setup.sh "$build" \
  "-DCMAKE_CXX_FLAGS=$flags -D_GLIBCXX_ASSERTIONS" "-DCMAKE_CXX_FLAGS_DEBUG=-O1 -g1" \
  "-DCMAKE_EXE_LINKER_FLAGS=$flags" "-DCMAKE_SHARED_LINKER_FLAGS=$flags" \
  -DCONVNETS_BUILD_PYTHON=OFF || status=$?  # an ASan extension needs the runtime preloaded into Python
echo "sanitize: set up and built in $((SECONDS - start)) s"
if ((status == 0)); then
  start=$SECONDS
  ctest --test-dir "$build" --output-on-failure -j 2 "$@" || status=$?
  echo "sanitize: tests ran in $((SECONDS - start)) s"
fi
if reports; then
  echo "sanitize: FAILED: sanitizer reports above (also in $logs)"
  exit 1
fi
if ((status)); then echo "sanitize: FAILED (exit status $status)"; exit "$status"; fi
echo "sanitize: passed, no sanitizer report"
