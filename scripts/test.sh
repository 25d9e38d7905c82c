#!/usr/bin/env bash
# Set up, build and run the whole test suite (CTest: GoogleTest + end-to-end CLI tests), then replay the fuzz corpora.
#   scripts/test.sh           everything (CI, the README's command)
#   scripts/test.sh --quick   while working on a change: every test but the `accuracy` label (trained networks'
#                             accuracy at its real size) and no fuzz replay; extra arguments go to ctest (-R NAME ...)
# Each test claims its share of `ctest -j`'s slots and as many threads (tests/CMakeLists.txt says why).
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
if [[ ${1:-} == --quick ]]; then
  quick=1
  shift
fi
./scripts/setup.sh
jobs=$(nproc)
started=$SECONDS
if ((quick)); then
  ctest --test-dir build --output-on-failure -j "$jobs" --label-exclude accuracy "$@"
  echo "test: quick suite (no accuracy label, no fuzz replay) in $((SECONDS - started)) s"
  exit 0
fi
ctest --test-dir build --output-on-failure -j "$jobs" "$@"
echo "test: CTest in $((SECONDS - started)) s"
# Every fuzz corpus input (seeds and past findings) once, under ASan + UBSan.
FUZZ_SETUP=0 ./scripts/fuzz.sh regress
