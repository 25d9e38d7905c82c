#!/usr/bin/env bash
# Set up, build and run the whole test suite (CTest: GoogleTest + end-to-end CLI tests).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
ctest --test-dir build --output-on-failure -j 2
