#!/usr/bin/env bash
# Set up, build and run the whole test suite (CTest: GoogleTest + end-to-end CLI tests), then replay the fuzz corpora.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
ctest --test-dir build --output-on-failure -j 2
# Every fuzz corpus input (seeds and past findings) once, under ASan + UBSan.
FUZZ_SETUP=0 ./scripts/fuzz.sh regress
