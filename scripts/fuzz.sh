#!/usr/bin/env bash
# Fuzz the parsers of untrusted input (fuzz/*.cpp: images and the transforms,
# dataset index files, WebDataset tar shards and their DALI indexes, JSON definitions and recipes,
# safetensors, torch.save archives, which format a weights file is, GPUNet definitions built into networks, inference request bodies) with
# libFuzzer under AddressSanitizer + UndefinedBehaviorSanitizer.
#   scripts/fuzz.sh [TARGET|all] [SECONDS]   fuzz each target for SECONDS (default 60)
#   scripts/fuzz.sh regress                  run every committed corpus input once (CI)
# FUZZ_RUNS=N stops a target after N executions instead (whichever comes first).
# New coverage goes to build-fuzz/corpus/TARGET, a crash to
# build-fuzz/artifacts/TARGET/; a fixed crash's input belongs in fuzz/corpus/TARGET.
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
seconds=${2:-60}
targets=(image dataset json safetensors torch_save weights_format gpunet_build tar kserve)

# Debian packages (clang among them) and .venv's torch; FUZZ_SETUP=0 skips it when done already.
[[ ${FUZZ_SETUP:-1} == 0 ]] || ./scripts/setup.sh >/dev/null
torch_dir=$(.venv/bin/python -c 'import os, torch; print(os.path.dirname(torch.__file__))')
cmake -S fuzz -B build-fuzz -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCONVNETS_TORCH_DIR="$torch_dir" >/dev/null
# Quiet when it builds; its errors when it does not (set -e alone would end the script without a word).
cmake --build build-fuzz >build-fuzz/build.log 2>&1 ||
  { grep -m 5 -B 2 -A 6 -E 'error|FAILED' build-fuzz/build.log || true; echo "fuzz: the fuzz targets did not build (build-fuzz/build.log)"; exit 1; }

# LibTorch is not instrumented: scripts/lsan.supp (shared with sanitize.sh) names its allocations.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$PWD/scripts/lsan.supp:print_suppressions=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

if [[ $what == regress ]]; then
  for t in "${targets[@]}"; do
    n=$(find fuzz/corpus/$t -type f | wc -l)
    # Each file once, as a regression test: any crash, leak or UB report fails.
    find fuzz/corpus/$t -type f -print0 | xargs -0 -r build-fuzz/fuzz_$t -rss_limit_mb=4096 -timeout=30 \
      >build-fuzz/regress-$t.log 2>&1 || { tail -40 build-fuzz/regress-$t.log; echo "fuzz: $t FAILED"; exit 1; }
    echo "fuzz: $t: $n corpus inputs, no finding"
  done
  exit 0
fi

[[ $what == all ]] || targets=("$what")
for t in "${targets[@]}"; do
  [[ -x build-fuzz/fuzz_$t ]] || { echo "fuzz: no target '$t' (expected one of ${targets[*]})"; exit 2; }
  mkdir -p build-fuzz/corpus/$t build-fuzz/artifacts/$t
  log=build-fuzz/fuzz-$t.log
  echo "fuzz: $t for ${seconds}s${FUZZ_RUNS:+ or $FUZZ_RUNS runs} (log: $log)"
  # -rss_limit_mb: an input that needs gigabytes is a finding (the limits should have refused it).
  build-fuzz/fuzz_$t build-fuzz/corpus/$t fuzz/corpus/$t -max_total_time="$seconds" ${FUZZ_RUNS:+-runs=$FUZZ_RUNS} \
    -rss_limit_mb=2048 -timeout=20 -max_len=65536 -print_final_stats=1 \
    -artifact_prefix=build-fuzz/artifacts/$t/ >"$log" 2>&1 || { tail -60 "$log"; echo "fuzz: $t FOUND A CRASH"; exit 1; }
  grep -E "^stat::number_of_executed_units|^stat::peak_rss_mb|^#[0-9]+.*DONE" "$log" | sed "s/^/fuzz: $t: /"
done
