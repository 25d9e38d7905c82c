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
select=() what=CTest
if ((quick)); then select=(--label-exclude accuracy) what="CTest (quick: no accuracy label, no fuzz replay)"; fi
started=$SECONDS
ctest --test-dir build --output-on-failure -j "$(nproc)" "${select[@]}" "$@"
echo "test: $what in $((SECONDS - started)) s"
if ((quick)); then exit 0; fi
# Every fuzz corpus input (seeds and past findings) once, under ASan + UBSan.
FUZZ_SETUP=0 ./scripts/fuzz.sh regress
