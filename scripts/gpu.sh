#!/usr/bin/env bash
# The GPU machine's script, in stages that fit its 10-minute commands, and its rehearsals on a machine without a GPU.
#
#   here:  scripts/gpu.sh prepare              Debian build deps and photographs into .deps/ (git-ignored); checks the carry size
#          scripts/gpu.sh preflight [--keep]   `run build` against PyPI's torch 2.11.0 (the GPU machine's) in a scratch venv,
#                                              every stage on the CPU with that build, and its binaries into .deps/ to travel
#          scripts/gpu.sh run --dry STAGE...   every stage's shell logic and peer scripts on the CPU at a tiny size
#   there: scripts/gpu.sh run STAGE...         (device tool, carry [".deps"]); STAGE: build tests data train infer python,
#                                              all (those six); fused and autotune (issue 67's, about 8 and 6
#                                              minutes) and graphs (issue 59's, about 7) each take a call of their own
#
# Results: $OUT/summary.txt (one PASS/FAIL line per step), $OUT/summary.json (every measured cell against its peer
# of the same call: bench/compare.py --summary; committed as bench/results/DATE-GPU/summary.json) and
# $OUT/STAGE.tar.gz (each step's log and JSON); $OUT defaults to ./gpu-out. The exit status is 1 when any step
# failed. On the GPU a call stops starting steps 570 s in (the device tool kills a command at 600 s), and a stage
# reuses what the same machine already built or generated. A dry run names each step by what it ran (fp32 on the
# CPU), and names the steps only a GPU runs on GPU lines.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
# python last: its module is built there (about 100 s on the H200's 16 cores), and `all` runs about 9.5 minutes, so
# where a 10-minute call runs short it is the stage cut, not the figures against the peers.
STAGES=(build tests data train infer python)
# Stages outside `all`: an open GPU issue's, each sized to a call of its own.
EXTRA_STAGES=(fused autotune graphs)
# The binaries every stage but python runs; the preflight's travel prebuilt (.deps/prebuilt.tar.gz).
TARGETS=(convnets tests/unit_tests tests/data_tests)
# What the binaries are compiled from: a prebuilt set is used only where these are unchanged since it was made.
SOURCES=(CMakeLists.txt cmake recipes src tests/CMakeLists.txt tests/test_*.cpp tests/*.h)

usage() { sed -n '2,12p' "$0" >&2; exit 2; }
die() { echo "gpu.sh: $*" >&2; exit 2; }

# ---------------------------------------------------------------------------------------------------- prepare
# What travels to the GPU machine: the working tree (tracked and untracked-not-ignored files) and the carried .deps/,
# 64 MiB together (the device tool's limit).
carry_size() {
  local tree deps limit=$((64 * 1024 * 1024))
  tree=$(git ls-files -z --cached --others --exclude-standard | xargs -0 -r stat -c %s -- 2>/dev/null |
         awk '{s += $1} END {print s + 0}')
  deps=$(du -sb .deps 2>/dev/null | cut -f1); deps=${deps:-0}
  awk -v t="$tree" -v d="$deps" 'BEGIN {
    printf "carry: working tree %.1f MiB + .deps %.1f MiB = %.1f MiB of the 64 MiB limit\n", t / 2^20, d / 2^20, (t + d) / 2^20 }'
  if ((tree + deps > limit)); then
    echo "gpu.sh: over the device tool's 64 MiB: ignore or delete what need not travel (du -sh .deps/*)" >&2
    return 1
  fi
}

# The identity of a PyTorch build: a prebuilt convnets runs only against the very build it was linked with.
torch_id() { "$1" -c 'import torch; print(torch.__version__, torch.version.git_version, torch.version.cuda)'; }
sources_id() { (cd "$root" && find "${SOURCES[@]}" -type f -print0 | LC_ALL=C sort -z | xargs -0 sha1sum | sha1sum | cut -c1-16); }

prepare() {
  local shared=${SHARED:-../shared}
  [[ -x $shared/tools/carry-debs.sh ]] || die "prepare: $shared/tools/carry-debs.sh not found (set SHARED=DIR)"
  # An unpacked root from an older version of this script would travel too; `run` unpacks into its build folder.
  rm -rf .deps/root .deps/debs
  # The libraries CMakeLists.txt finds (JPEG, PNG, zlib, nlohmann-json, CLI11, GoogleTest) and the Gloo headers
  # backend_gloo.cpp compiles with. Debian's zlib1g (the runtime) is not carried: every system has one.
  "$shared/tools/carry-debs.sh" download -o .deps \
    libjpeg62-turbo libjpeg62-turbo-dev libpng16-16 libpng-dev zlib1g-dev nlohmann-json3-dev libcli11-dev \
    libgtest-dev libgmock-dev libgloo-dev \
    libboost1.74-dev
  cp "$shared/tools/carry-debs.sh" .deps/
  # bench/serve_load.py's client (tritonclient's HTTP half, what it imports) for the GPU machine's Python 3.12, at the
  # versions scripts/requirements.txt pins; unpacked there by need_serve_client.
  local wheel pins=()
  for wheel in tritonclient geventhttpclient gevent greenlet zope.event zope.interface brotli certifi urllib3 \
               python-rapidjson ml_dtypes; do
    local pin
    pin=$(grep -m 1 -i -E "^$wheel(\[|==)" "$root/scripts/requirements.txt" | sed 's/\[.*\]//') ||
      die "prepare: scripts/requirements.txt pins no $wheel (bench/serve_load.py's client needs it)"
    pins+=("$pin")
  done
  rm -rf .deps/wheels
  "$root/.venv/bin/python" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_5_x86_64 \
    --platform manylinux1_x86_64 -d .deps/wheels "${pins[@]}" || die "prepare: pip download ${pins[*]} failed"
  # cuDNN's header-only frontend (the NormConv graphs; the machine's PyTorch environment lacks it), from .venv.
  local fe; fe=$(ls -d "$root"/.venv/lib/python3*/site-packages/include 2>/dev/null | head -1)
  [[ -f $fe/cudnn_frontend.h ]] || die "prepare: no cudnn_frontend.h in .venv (scripts/setup.sh installs nvidia-cudnn-frontend)"
  rm -rf .deps/cudnn-frontend; mkdir -p .deps/cudnn-frontend
  cp -r "$fe" .deps/cudnn-frontend/include
  # The ImageNet-like set's source photographs (python3-skimage is not there).
  mkdir -p .deps/photos
  local skdata=/usr/lib/python3/dist-packages/skimage/data  # Debian's python3-skimage
  for f in astronaut.png chelsea.png coffee.png rocket.jpg hubble_deep_field.jpg retina.jpg motorcycle_left.png ihc.png \
           camera.png coins.png; do cp "$skdata/$f" .deps/photos/; done
  # What made it: the GPU machine's copy has no .git to ask.
  echo "$(git describe --always --dirty 2>/dev/null || echo unknown) prepared $(date -u +%Y-%m-%dT%H:%MZ)" >.deps/source.txt
  carry_size
  echo "next: scripts/gpu.sh preflight (here), then device run, carry [\".deps\"]: scripts/gpu.sh run build tests"
}

# ---------------------------------------------------------------------------------------------------- steps
# step [--show N | --gtest] [--limit S] NAME CMD...: runs CMD with its output in the stage's NAME.log and adds one
# line to summary.txt: PASS or FAIL, the time, and on failure (or with --show) the log's last lines (--gtest: its
# totals; the log keeps each test's name, so a crash shows which test was running). A failed step does not end the
# stage (the GPU hour is scarce: the next step may still measure something); the run's exit status does.
step() {
  local show=0 limit=$step_limit totals=''
  while [[ $1 == --* ]]; do
    case $1 in
      --show) show=$2; shift 2 ;;
      --limit) limit=$2; shift 2 ;;
      --gtest) totals='^\[(==========|  PASSED  |  SKIPPED |  FAILED  )\] [0-9]'; shift ;;
      *) die "step: unknown option $1" ;;
    esac
  done
  local name=$1; shift
  local log=$res/$name.log t0=$SECONDS rc=0
  printf '$ %s\n' "$*" >"$log"
  # A step the device tool would kill half-way loses its log and its line: better not to start it.
  if ((deadline)); then
    local left=$((deadline - SECONDS))
    if ((left < 20)); then
      failed=$((failed + 1)) last_rc=1
      say "FAIL $stage/$name (not started: ${deadline} s of this call are spent; run the stage again)"
      return 0
    fi
    if ((left < limit)); then limit=$left; fi
  fi
  local pre=()
  if [[ -n $frames_so && $name != configure && $name != compile ]]; then pre=(env "LD_PRELOAD=$frames_so"); fi
  timeout --kill-after=10 "$limit" "${pre[@]}" "$@" >>"$log" 2>&1 </dev/null || rc=$?
  local dt=$((SECONDS - t0))
  last_rc=$rc
  if ((rc == 0)); then
    passed=$((passed + 1))
    say "PASS $stage/$name (${dt} s)"
  else
    failed=$((failed + 1))
    local why="exit $rc"
    if ((rc == 124 || rc == 137)); then why="stopped at its ${limit} s limit"; fi
    say "FAIL $stage/$name ($why, ${dt} s; log: $stage.tar.gz $name.log)"
    if ((show >= 0 && show < 20)); then show=20; fi
    crash_frames "$log"
  fi
  if ((rc == 0)) && [[ -n $totals ]]; then
    grep -E "$totals" "$log" | sed 's/^/    /' | tee -a "$summary" || true
  elif ((show != 0)); then
    if ((show < 0)); then sed 's/^/    /' "$log"; else tail -n "$show" "$log" | sed 's/^/    /'; fi | tee -a "$summary"
  fi
  pack
  return 0
}

# gpu_step NAME CMD...: a step only a GPU can run. The dry run says it would have run it, with its command.
gpu_step() {
  if ((gpu)); then step "$@"; return; fi
  local name=$1; shift
  say "GPU  $stage/$name: $*"
}

# ran_on_gpu LOG [gtest|unittest]: on the GPU, the run in LOG passed tests and skipped none (its CUDA cases skip
# without CUDA). The verdict is check_ran (`gpu.sh _ran_on_gpu`), which the tests call on logs of their own: a dry
# run never reaches it.
ran_on_gpu() {
  gpu_step ran-not-skipped "$root/scripts/gpu.sh" _ran_on_gpu "$1" "${2:-gtest}"
}

# _ran_on_gpu LOG gtest|unittest: 0 when LOG shows a test passed and none skipped; else 1, saying why.
check_ran() {
  local log=$1 kind=${2:-} passed skipped
  case $kind in
    gtest) passed='^\[  PASSED  \] [1-9][0-9]* tests?\.' skipped='^\[  SKIPPED \]' ;;
    unittest) passed='^OK( \(|$)' skipped='skipped' ;;
    *) echo "gpu.sh _ran_on_gpu: unknown log kind '$kind' (gtest or unittest)" >&2; return 2 ;;
  esac
  [[ -f $log ]] || { echo "no log $log"; return 1; }
  if grep -n -E "$skipped" "$log"; then
    echo "a case skipped on the GPU, where every CUDA case must run (the lines above)"
    return 1
  fi
  grep -q -E "$passed" "$log" || { echo "no test passed in $log"; return 1; }
  echo "ran: every case passed, none skipped"
}

say() { echo "$*" | tee -a "$summary"; }

# crash_frames LOG: the native frames scripts/crash-frames.c printed into LOG when the step crashed, as function
# names (addr2line; symbols only, the binaries have no debug information), into the summary.
crash_frames() {
  grep -q '^crash-frame ' "$1" || return 0
  say "    native frames of the crash (scripts/crash-frames.c):"
  local file offset symbol name n=0
  while read -r _ file offset symbol && ((n++ < 40)); do
    name=$(addr2line -Cf -e "$file" "$offset" 2>/dev/null | head -1) || true
    if [[ -z $name || $name == '??' ]]; then name=$symbol; fi  # a stripped file: the dynamic symbol, if any
    echo "      $(basename "$file") $offset $name"
  done < <(grep '^crash-frame ' "$1") | tee -a "$summary"
}

# The crash-frames library every step but the build's own runs under (no gdb on the GPU machine); none where this
# machine cannot compile it, which costs only the frames.
build_frames() {
  frames_so=$work/crash-frames.so
  cc -shared -fPIC -O1 -o "$frames_so" "$root/scripts/crash-frames.c" 2>"$work/crash-frames.log" || frames_so=''
}
pack() { tar -czf "$out/$stage.tar.gz" -C "$res" . 2>/dev/null || true; }

# A free TCP port on the loopback interface for the data-parallel rendezvous.
free_port() { "$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# ---------------------------------------------------------------------------------------------------- stages
# native_build TARGET...: the GPU build, what CI builds with the kernels for Hopper (9.0) only, against the machine's
# own PyTorch; configured once per build folder. Without ONNX and OpenVINO: the GPU machine has neither and no stage
# needs them; with serve (Boost.Beast's headers from Debian's libboost1.74-dev, carried), which the graphs stage
# loads. Boost_DIR names the carried copy's CMake config, so the preflight sees what the GPU machine will, not
# this machine's /usr (whose Boost find_package would otherwise take quietly). serve's gRPC service is left out:
# the GPU machine has no gRPC, and the stages measure HTTP (the preflight builds as it will). No RUNPATH: the binaries find LibTorch, its CUDA libraries and Debian's through LD_LIBRARY_PATH
# (run sets it), the same way here and there, so the preflight's binaries can travel. Debian's jconfig.h sits in the
# multiarch folder that CMake's FindJPEG does not add.
native_build() {
  local nvcc=${CONVNETS_NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
  nvcc=$(readlink -f "$nvcc") || { say "FAIL $stage/configure (no nvcc: not on PATH, nor /usr/local/cuda/bin/nvcc)"; exit 1; }
  local configure=(cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release
    "-DBoost_DIR=$deps_prefix/lib/x86_64-linux-gnu/cmake/Boost-1.74.0" -DBoost_NO_SYSTEM_PATHS=ON
    "-DCMAKE_PREFIX_PATH=$deps_prefix;$torch_prefix" -DTORCH_CUDA_ARCH_LIST=9.0
    "-DCMAKE_CUDA_COMPILER=$nvcc" "-DCUDAToolkit_ROOT=$(dirname "$(dirname "$nvcc")")"
    "-DCONVNETS_PYTHON=$(command -v "$py")" -DCONVNETS_WITH_OPENVINO=OFF -DCMAKE_DISABLE_FIND_PACKAGE_ONNX=ON
    -DCMAKE_SKIP_BUILD_RPATH=ON "-DCMAKE_CXX_FLAGS=-isystem $deps_prefix/include/x86_64-linux-gnu"
    -DCMAKE_DISABLE_FIND_PACKAGE_gRPC=ON)
  local line="${configure[*]}"
  if ((!do_build)); then
    gpu_step configure "${configure[@]}"
    step check-build test -f "$build/build.ninja"
    step --show 3 up-to-date ninja -C "$build" -n "$@"
    return 0
  fi
  if [[ -f $build/build.ninja && "$(cat "$build/gpu-configure.txt" 2>/dev/null)" == "$line" ]]; then
    say "REUSE $stage/configure: $build, configured by an earlier call"
  else
    step --limit 300 configure "${configure[@]}"
    if ((last_rc == 0)); then echo "$line" >"$build/gpu-configure.txt"; fi
    # CMake leaves serve out quietly where Boost is not found; the graphs stage needs it.
    step --show 3 serve-configured grep -F "convnets: serve with Boost.Beast" "$res/configure.log"
  fi
  step --limit "$build_limit" --show 2 compile ninja -C "$build" "$@"
  compiled=$((last_rc == 0))
  if ((!compiled)); then
    grep -m 1 -A 8 -E 'error:|undefined reference|CMake Error' "$res/compile.log" | sed 's/^/    first error: /' |
      tee -a "$summary" || true
    return 0
  fi
  # A header of a carried package taken from the machine's own /usr/include would compile against one version of a
  # library and run against another: every header must come from .deps.
  step --show 10 headers-from-deps "$root/scripts/gpu.sh" _headers "$deps_prefix" "$build"
  # A static libstdc++ inside a binary crashed the module there (CONVNETS_LIBSTDCXX in CMakeLists.txt says how).
  local files=() t
  for t in "$@"; do
    if [[ $t == convnets_python ]]; then files+=("$build"/python/convnets/_convnets*.so); else files+=("$build/$t"); fi
  done
  step --show 10 shared-libstdcxx "$root/scripts/check-libstdcxx.sh" "${files[@]}"
}

# The build stage: the preflight's prebuilt binaries where they were linked against this very PyTorch from these very
# sources (minutes saved on every fresh machine), else a native build; the Python module is built by its stage.
stage_build() {
  if ((do_build)) && [[ ${CONVNETS_GPU_PREBUILT:-auto} != no && -f $root/.deps/prebuilt.tar.gz ]]; then
    local want have_torch have_sources sources meta=()
    want=$(torch_id "$py") sources=$(sources_id)
    # prebuilt.txt: the torch it was linked against, the sources' id, what it holds.
    [[ -f $root/.deps/prebuilt.txt ]] && mapfile -t meta <"$root/.deps/prebuilt.txt"
    have_torch=${meta[0]:-} have_sources=${meta[1]:-}
    if [[ $have_torch == "$want" && $have_sources == "sources $sources" ]]; then
      # Unpacked and run once: binaries that do not run here (a library or a libc missing) fall back to a build,
      # which is not a failure of this run.
      rm -rf "$work/prebuilt"; mkdir -p "$work/prebuilt"
      local t0=$SECONDS
      if tar -xzf "$root/.deps/prebuilt.tar.gz" -C "$work/prebuilt" >"$res/prebuilt.log" 2>&1 &&
         timeout 120 "$work/prebuilt/convnets" --version >>"$res/prebuilt.log" 2>&1; then
        bin=$work/prebuilt passed=$((passed + 1))
        say "PASS build/prebuilt ($((SECONDS - t0)) s): the preflight's binaries, ${meta[2]:-}"
      else
        say "NOTE build/prebuilt: the preflight's binaries do not run here: building here"
        tail -n 5 "$res/prebuilt.log" | sed 's/^/    /' | tee -a "$summary"
      fi
      pack
    else
      say "NOTE build/prebuilt: made for torch '$have_torch', $have_sources; here torch '$want', sources" \
          "$sources: building here"
    fi
  fi
  if [[ $bin != "$work/prebuilt" ]]; then
    native_build "${TARGETS[@]}"
    if ((!compiled)); then
      say "== stage build: the build failed, and every other stage runs what it builds: stopping"
      exit 1
    fi
    bin=$build
  fi
  step --show 3 version "$bin/convnets" --version
  built=1
}

need_build() { ((built)) || run_stage build; }

# The unit suites. On the GPU the CUDA cases must run, not skip: a skip there is a failure. A dry run runs only the
# CPU build's own CUDA checks (CTest runs the rest); the preflight runs them all against torch 2.11.
stage_tests() {
  need_build
  step --gtest gpu-cases "$bin/tests/unit_tests" --gtest_filter='Gpu.*'
  ran_on_gpu "$res/gpu-cases.log"
  # The reference files (GPUNet keys, parameter counts) where ../shared is beside the checkout: here, not there.
  step --limit 420 --gtest unit-tests env CONVNETS_SHARED_DIR="${CONVNETS_SHARED_DIR:-$root/../shared}" \
    "$bin/tests/unit_tests" --gtest_filter="$unit_filter"
  step --gtest normalize-kernels "$bin/tests/data_tests" --gtest_filter='Normalize*'
}

# The ImageNet-like JPEG set (3,080 files on the GPU, 140 in a dry run: the device decoder tests read 40 val files
# and 3 batches of 32), made once per build folder.
need_data() {
  local args=(--train-per-class "$per_class" --val-per-class "$val_per_class")
  if [[ -d $root/.deps/photos ]]; then args+=(--sources "$root/.deps/photos"); fi
  if [[ "$(cat "$jpegs/.made-by" 2>/dev/null)" == "${args[*]}" ]]; then
    if [[ $stage == data ]]; then say "REUSE $stage/make-jpegs: $jpegs, made by an earlier call"; fi
    return 0
  fi
  rm -rf "$jpegs"
  step --show 1 make-jpegs "$py" "$root/scripts/make_imagenet_like.py" "$jpegs" "${args[@]}"
  if ((last_rc == 0)); then echo "${args[*]}" >"$jpegs/.made-by"; fi
}

# Issue 9: training from JPEG files against the same step on synthetic data, the CPU loader and the hybrid
# device decoder, with the stage breakdown; the device decoder's kernels against their host loops.
stage_data() {
  need_build
  need_data
  step --gtest device-decode env CONVNETS_IMAGENET_LIKE="$jpegs" "$bin/tests/data_tests" \
    --gtest_filter='DeviceDecode*'
  ran_on_gpu "$res/device-decode.log"
  local b
  for b in cpu gpu; do
    step --show 4 "loader-$b" "$bin/convnets" bench data "$jpegs" --train --data-backend "$b" --images "$data_images" \
      --batch-size "$data_batch" --image-size "$size"
    step --show 1 "loader-$b-1-worker" "$bin/convnets" bench data "$jpegs" --train --data-backend "$b" --workers 1 \
      --images "$data_images_1" --batch-size "$data_batch" --image-size "$size"
  done
  # 3,000 training files make 11 batches of 256: the 60 steps cross 5 epoch boundaries, each a loader restart that
  # synthetic data does not pay (docs/history/gpu-predictions-2026-11-21-to-25.md counts it in the prediction).
  step --show 12 train-from-files "$bin/convnets" bench train --arch "$arch" --device "$device" --precision "$amp" \
    --batch-sizes "$big" --image-size "$size" --warmup "$warmup" --iterations "$files_iterations" --data "$jpegs" \
    --data-backend "$file_backends" --json "$res/train-files.json"
  if ((!gpu)); then say "GPU  $stage/train-from-files: --data-backend synthetic,cpu,gpu (the device decoder's step needs CUDA)"; fi
}

# Issue 34: the Python package's loader with device="cuda" against its CPU path (the tests' Cuda class), and
# examples/train_pytorch.py fed by it. The module is built here, against this machine's Python (3.12 there).
stage_python() {
  need_build
  native_build convnets_python
  need_data
  step --show 3 loader-cuda env -C "$root/tests/python" CONVNETS_BIN="$bin/convnets" CONVNETS_SOURCE_DIR="$root" \
    CONVNETS_PYTHONPATH="$build/python" CONVNETS_IMAGENET_LIKE="$jpegs" "$py" -m unittest -v test_python_package.Cuda
  ran_on_gpu "$res/loader-cuda.log" unittest
  # Issue 58: the same loop fed by convnets' loader, by one synthetic batch and by torchvision's DataLoader, in the
  # precision it ran (amp on the GPU), convnets' loader first: what a cut call keeps.
  local l runs=()
  for l in convnets synthetic torchvision; do
    step --show 3 "train-pytorch-example-$example_precision-$l" env PYTHONPATH="$build/python" "$py" \
      "$root/examples/train_pytorch.py" "$jpegs" --arch "$arch" --image-size "$size" --batch-size "$big" \
      --epochs "$example_epochs" --max-steps "$example_steps" --device "$device" --workers "$example_workers" \
      --max-val-images "$big" ${example_amp:+"$example_amp"} --loader "$l" --json "$res/train-pytorch-$l.json"
    runs+=("$res/train-pytorch-$l.json")
  done
  step --show -1 "compare-example-$example_precision" "$py" "$root/bench/loop_sources.py" "${runs[@]}" \
    --summary "$summary_json"
}

# bench_pair MODE PRECISION BATCHES [compile]: convnets and PyTorch eager (and torch.compile) on the same synthetic
# step, then the ratio table, its cells appended to summary.json. The steps and files are named by the precision
# they ran (a dry run's: fp32).
# bench_args PRECISION: the options every timed run shares, into `common`.
bench_args() {
  common=(--arch "$arch" --device "$device" --precision "$1" --image-size "$size" --warmup "$warmup"
          --iterations "$iterations")
}

bench_pair() {
  local mode=$1 p=$2 batches=$3 with_compile=${4:-}
  local common
  bench_args "$p"
  local tag="$mode-$p" files=()
  step --show 8 "convnets-$tag" "$bin/convnets" bench "$mode" "${common[@]}" --batch-sizes "$batches" \
    --json "$res/convnets-$tag.json"
  files+=("$res/convnets-$tag.json")
  step --show 1 "eager-$tag" "$py" "$root/bench/torch_peer.py" "$mode" "${common[@]}" --batch-sizes "$batches" \
    --json "$res/eager-$tag.json"
  files+=("$res/eager-$tag.json")
  if [[ -n $with_compile ]]; then
    # One batch size: each new shape is a recompilation, minutes of the hour.
    step --show 1 "compile-$tag" "$py" "$root/bench/torch_peer.py" "$mode" --compile \
      --compile-backend "$compile_backend" "${common[@]}" --batch-sizes "$big" --json "$res/compile-$tag.json"
    files+=("$res/compile-$tag.json")
  fi
  step --show -1 "compare-$tag" "$py" "$root/bench/compare.py" "${files[@]}" --summary "$summary_json"
}

# Issue 5: ResNet-50 training, convnets against PyTorch eager and torch.compile; issue 6: one process on NCCL
# (the data-parallel step with its gradient all-reduce, on one GPU) against the same process alone.
stage_train() {
  need_build
  bench_pair train "$amp" "$train_batches" compile
  if ((gpu)); then
    bench_pair train "$bf16" "$big"
    bench_pair train "$tf32" "$big"
  else
    say "GPU  train/{convnets,eager,compare}-train-{bf16,tf32}: the pair above in bf16 and in tf32 (fp32 here)"
  fi
  local common
  bench_args "$amp"
  step --show 6 one-process-nccl "$bin/convnets" bench train "${common[@]}" --batch-sizes "$big" --nproc-per-node 1 \
    --master-port "$(free_port)" --json "$res/nccl-1.json"
}

# Issue 8: inference throughput and latency; issue 7: GPUNet batch-1 fp16 latency against the same network in
# PyTorch eager (bench/gpunet_reference.py, built from convnets' own definition so nothing from shared/ travels).
stage_infer() {
  need_build
  bench_pair infer "$amp" "$infer_batches"
  # What the inference engine offers beyond eager: BatchNorm folded into the convolutions (issue 8).
  local common
  bench_args "$amp"
  step --show 8 convnets-infer-folded "$bin/convnets" bench infer --fold-bn "${common[@]}" \
    --batch-sizes "$infer_batches" --json "$res/convnets-infer-folded.json"
  step --show -1 compare-infer-folded "$py" "$root/bench/compare.py" "$res/convnets-infer-folded.json" \
    "$res/eager-infer-$amp.json" --figure-note "BN folded" --summary "$summary_json"
  local net
  for net in gpunet-0 gpunet-d1; do gpunet_latency "$net"; done
}

# gpunet_latency NET [compile]: NET's batch-1 latency in convnets (its definition from `convnets models`) and in
# bench/gpunet_reference.py's PyTorch build of the same definition, eager (and under torch.compile reduce-overhead,
# where inductor runs), compared into summary.json.
gpunet_latency() {
  local net=$1 with_compile=${2:-}
  step "$net-definition" sh -c '"$1" models --arch "$2" --definition >"$3"' _ "$bin/convnets" "$net" "$res/$net.json"
  local ours=("$bin/convnets" bench infer --arch "$net" --device "$device" --precision "$amp" --batch-sizes 1
              --warmup "$warmup" --iterations "$latency_iterations")
  # BN folded and the convs fused (the engine at its best), and as it runs unfolded.
  step --show 6 "convnets-$net" "${ours[@]}" --fold-bn --json "$res/convnets-$net.json"
  step --show 6 "convnets-$net-unfolded" "${ours[@]}" --json "$res/convnets-$net-unfolded.json"
  local reference=("$py" "$root/bench/gpunet_reference.py" --config "$res/$net.json" --latency --device "$device"
                   --batch-size 1 --precision "$half" --warmup "$warmup" --iterations "$latency_iterations")
  step --show 1 "eager-$net" "${reference[@]}" --json "$res/eager-$net.json"
  local peers=("convnets BN unfolded=$res/convnets-$net-unfolded.json" "$res/eager-$net.json")
  if [[ -n $with_compile && $compile_backend == inductor ]]; then
    step --show 1 "compile-reduce-overhead-$net" "${reference[@]}" --compile-mode reduce-overhead \
      --json "$res/compile-reduce-overhead-$net.json"
    peers+=("$res/compile-reduce-overhead-$net.json")
  fi
  step --show -1 "compare-$net" "$py" "$root/bench/compare.py" "$res/convnets-$net.json" "${peers[@]}" \
    --summary "$summary_json"
}

# Issue 67: the ResNet training step as `--fusion auto` tunes it (each block shape's verified paths timed at the
# first step, the fastest kept and cached), against itself on each path forced and against PyTorch eager (fused SGD)
# and torch.compile's default and reduce-overhead in the same call, each profiled per kernel family
# (bench/profile_families.py); the paths' numerics first; the second run reading the tuning cache; then the JPEG rows
# at the new step's speed, where the call has room. max-autotune takes a call of its own (stage_autotune).
stage_fused() {
  need_build
  step --gtest fused-numerics "$bin/tests/unit_tests" --gtest_filter='Gpu.Fused*:Gpu.NormConv*:Gpu.BnStats*'
  ran_on_gpu "$res/fused-numerics.log"
  local common p=$amp
  bench_args "$p"
  local prof=(--profile-steps "$profile_steps") files=() cache=$res/tuning.json
  rm -f "$cache"
  # The default, as a user's first run on this GPU: the tuner times every block shape, then writes the cache.
  step --show 12 "convnets-$p" "$bin/convnets" bench train "${common[@]}" --batch-sizes "$fused_batches" \
    --tuning-cache "$cache" --json "$res/convnets-$p.json" --profile "$res/convnets-$p.trace.json" "${prof[@]}"
  # The second run: from the cache, timing nothing, its first step shorter by what the timing cost.
  step --show 8 "convnets-$p-cached" "$bin/convnets" bench train "${common[@]}" --batch-sizes "$big" \
    --tuning-cache "$cache" --json "$res/convnets-$p-cached.json"
  step --show 8 "convnets-$p-fusion-bn" "$bin/convnets" bench train "${common[@]}" --fusion bn \
    --batch-sizes "$big" --tuning-cache none --json "$res/convnets-$p-fusion-bn.json"
  step --show 8 "convnets-$p-fusion-none" "$bin/convnets" bench train "${common[@]}" --fusion none \
    --batch-sizes "$big" --json "$res/convnets-$p-fusion-none.json" \
    --profile "$res/convnets-$p-fusion-none.trace.json" "${prof[@]}"
  # The eager step of the tuned build, whose trace names the optimizer's kernels (a replayed graph cannot).
  step --show 8 "convnets-$p-eager-step" "$bin/convnets" bench train "${common[@]}" --no-cuda-graph \
    --tuning-cache "$cache" --batch-sizes "$big" --json "$res/convnets-$p-eager-step.json" \
    --profile "$res/convnets-$p-eager-step.trace.json" "${prof[@]}"
  step --show 1 "eager-$p" "$py" "$root/bench/torch_peer.py" train "${common[@]}" --batch-sizes "$fused_batches" \
    --json "$res/eager-$p.json" --profile "$res/eager-$p.trace.json" "${prof[@]}"
  files+=("convnets --fusion bn=$res/convnets-$p-fusion-bn.json"
          "convnets --fusion none=$res/convnets-$p-fusion-none.json" "$res/eager-$p.json")
  local modes=(default)
  if [[ $compile_backend == inductor ]]; then modes+=(reduce-overhead); fi
  compile_peers train "" "$big" "${modes[@]}"
  step --show -1 "compare-$p" "$py" "$root/bench/compare.py" "$res/convnets-$p.json" "${files[@]}" \
    --figure-note "tuned fusion, synthetic data" --summary "$summary_json"
  step --show -1 "profile-$p" "$py" "$root/bench/profile_families.py" "convnets=$res/convnets-$p.trace.json" \
    "convnets --fusion none=$res/convnets-$p-fusion-none.trace.json" \
    "convnets eager step=$res/convnets-$p-eager-step.trace.json" "pytorch eager=$res/eager-$p.trace.json" \
    --steps "$profile_steps" --json "$res/profile-$p.json"
  # The loader against the faster step: 3,000 files (an epoch of 11 batches: a restart every 11 steps) and the same
  # files linked 4 times (12,000: one restart in 60 steps), each against the same step on synthetic data.
  need_data
  need_data_x4
  local set
  for set in "$jpegs" "$jpegs_x4"; do
    step --show 12 "train-from-$(basename "$set")" "$bin/convnets" bench train --arch "$arch" --device "$device" \
      --precision "$p" --batch-sizes "$big" --image-size "$size" --warmup "$warmup" --iterations "$files_iterations" \
      --data "$set" --data-backend synthetic,cpu --tuning-cache "$cache" --json "$res/train-from-$(basename "$set").json"
  done
}

# Issue 67, its own call: PyTorch at its strongest, torch.compile's max-autotune with and without CUDA graphs (each
# kernel's Triton and cuBLAS candidates benchmarked: minutes of compilation, recorded as each row's first_step_s),
# against convnets' default step on the same machine in the same call; and the NormConv path forced, for the table.
stage_autotune() {
  need_build
  local common p=$amp files=() mode
  bench_args "$p"
  step --show 8 "convnets-$p" "$bin/convnets" bench train "${common[@]}" --batch-sizes "$big" \
    --json "$res/convnets-$p.json"
  step --show 8 "convnets-$p-fusion-normconv" "$bin/convnets" bench train "${common[@]}" --fusion normconv \
    --batch-sizes "$big" --json "$res/convnets-$p-fusion-normconv.json"
  files+=("convnets --fusion normconv=$res/convnets-$p-fusion-normconv.json")
  # Issue 70: what a checkpoint saved mid-epoch costs the steps around it, synchronous against in the background.
  step --show 7 "convnets-$p-save-every" "$bin/convnets" bench train "${common[@]}" --batch-sizes "$big" \
    --save-every "$save_every" --saves "$saves" --json "$res/convnets-$p-save-every.json"
  for mode in max-autotune max-autotune-no-cudagraphs; do
    if [[ $compile_backend != inductor ]]; then
      say "SKIP $stage/compile-inductor-$mode-$p: inductor's modes run on the GPU only"
      continue
    fi
    step --limit "$max_autotune_s" --show 1 "compile-inductor-$mode-$p" "$py" "$root/bench/torch_peer.py" train \
      --compile --compile-mode "$mode" "${common[@]}" --batch-sizes "$big" --json "$res/compile-inductor-$mode-$p.json"
    if ((last_rc == 0)); then files+=("$res/compile-inductor-$mode-$p.json"); fi
  done
  step --show -1 "compare-$p" "$py" "$root/bench/compare.py" "$res/convnets-$p.json" "${files[@]}" \
    --figure-note "tuned fusion, synthetic data" --summary "$summary_json"
}

# Issue 59: inference replaying a CUDA graph per batch size against the same engine eager and PyTorch eager and
# torch.compile "reduce-overhead" (CUDA graphs too; max-autotune where the call has room): ResNet-50 amp at 1, 64 and
# 256; GPUNet-0 and GPUNet-D1 at batch 1 in fp16, with the GPU compute time (CUDA events, trtexec's figure) beside
# the end-to-end latency. The graphs' numerics first.
stage_graphs() {
  need_build
  step --gtest graph-numerics "$bin/tests/unit_tests" --gtest_filter='Gpu.Graphed*:Gpu.Inference*'
  ran_on_gpu "$res/graph-numerics.log"
  local common p=$amp files=() mode
  bench_args "$p"
  # convnets at its best first (BN folded, each conv with its bias, activation and skip one cuDNN graph), then
  # what each part buys: the folded convs unfused, BN unfolded, no CUDA graph.
  step --show 12 "convnets-infer-$p-fold-bn" "$bin/convnets" bench infer "${common[@]}" --fold-bn \
    --batch-sizes "$infer_batches" --json "$res/convnets-infer-$p-fold-bn.json"
  step --show 12 "convnets-infer-$p-no-fused-conv" "$bin/convnets" bench infer "${common[@]}" --fold-bn \
    --no-fused-conv --batch-sizes "$infer_batches" --json "$res/convnets-infer-$p-no-fused-conv.json"
  step --show 12 "convnets-infer-$p" "$bin/convnets" bench infer "${common[@]}" --batch-sizes "$infer_batches" \
    --json "$res/convnets-infer-$p.json"
  step --show 8 "convnets-infer-$p-no-cuda-graph" "$bin/convnets" bench infer "${common[@]}" --no-cuda-graph \
    --batch-sizes "$infer_batches" --json "$res/convnets-infer-$p-no-cuda-graph.json"
  step --show 1 "eager-infer-$p" "$py" "$root/bench/torch_peer.py" infer "${common[@]}" --batch-sizes "$infer_batches" \
    --json "$res/eager-infer-$p.json"
  files+=("convnets --fold-bn --no-fused-conv=$res/convnets-infer-$p-no-fused-conv.json"
          "convnets BN unfolded=$res/convnets-infer-$p.json"
          "convnets --no-cuda-graph=$res/convnets-infer-$p-no-cuda-graph.json" "$res/eager-infer-$p.json")
  # One compiled shape per batch size: the smallest and the largest.
  local modes=(default)
  if [[ $compile_backend == inductor ]]; then modes=(reduce-overhead); fi
  compile_peers infer -infer "${infer_batches%%,*},${infer_batches##*,}" "${modes[@]}"
  step --show -1 "compare-infer-$p" "$py" "$root/bench/compare.py" "$res/convnets-infer-$p-fold-bn.json" "${files[@]}" \
    --figure-note "CUDA graphs, fused convs" --summary "$summary_json"
  local net
  for net in gpunet-0 gpunet-d1; do gpunet_latency "$net" compile; done
  # `serve` on the same engine (BN folded, fused, a CUDA graph per size its batcher fills) under tritonclient's
  # load on loopback, against `bench infer` in the same step: DLE's Triton tables (concurrency 1, 4, 16, 64), for
  # ResNet-50 and GPUNet-0; the clients spread over processes (serve_load.py --client-processes, half the cores).
  # Each image in the request over HTTP, then in the client's system shared memory (perf_analyzer's
  # --shared-memory system): the second takes the 0.6-1.2 MB bodies off the loopback socket.
  need_serve_client
  step --show 18 "serve-load-$p" "${serve_client[@]}" "$root/bench/serve_load.py" --convnets "$bin/convnets" \
    --arch "$arch" --device "$device" --precision "$p" --model-args=--fold-bn --batch-size "$serve_batch" \
    --concurrency "$serve_concurrency" --seconds "$serve_seconds" --warmup-seconds "$serve_warmup" --soak 0 \
    --protocols http,http-shm --json "$res/serve-load-$p.json" --summary "$summary_json"
  step --show 10 "serve-load-gpunet-0-$p" "${serve_client[@]}" "$root/bench/serve_load.py" --convnets "$bin/convnets" \
    --arch gpunet-0 --device "$device" --precision "$p" --model-args=--fold-bn --batch-size "$serve_batch" \
    --concurrency "$serve_concurrency" --seconds "$serve_seconds" --warmup-seconds "$serve_warmup" --soak 0 \
    --protocols http,http-shm --image-size "$gpunet0_side" --json "$res/serve-load-gpunet-0-$p.json" \
    --summary "$summary_json"
  # Issue 68: the same server loaded by `convnets bench serve` (C++, a thread and a connection per request in
  # flight; the client's and the server's CPU time per request), FP32 tensors over HTTP and from system shared
  # memory, then the ImageNet-like set's validation JPEGs sent encoded (the server decodes them), against bench infer.
  local bench_serve=("${serve_client[@]}" "$root/bench/serve_load.py" --convnets "$bin/convnets" --client bench-serve
                     --arch "$arch" --device "$device" --precision "$p" --model-args=--fold-bn
                     --batch-size "$serve_batch" --concurrency "$serve_concurrency" --seconds "$serve_seconds"
                     --warmup-seconds "$serve_warmup" --soak 0 --overload-concurrency 0 --summary "$summary_json")
  step --show 14 "serve-bench-$p" "${bench_serve[@]}" --protocols http,http-shm --json "$res/serve-bench-$p.json"
  need_data
  step --show 8 "serve-bench-jpeg-$p" "${bench_serve[@]}" --protocols http --client-input jpeg \
    --images "$jpegs/val" --json "$res/serve-bench-jpeg-$p.json"
}

# compile_peers train|infer INFIX BATCHES MODE...: bench/torch_peer.py under torch.compile in each mode (the modes
# beside the default are inductor's; the dry run's eager backend has its default only), step
# compile-BACKEND-MODE{INFIX}-PRECISION, each JSON added to the caller's `files`; `common` and `p` are the caller's.
compile_peers() {
  local what=$1 infix=$2 batches=$3 mode tag
  shift 3
  for mode in "$@"; do
    tag="compile-$compile_backend-$mode$infix-$p"
    step --show 1 "$tag" "$py" "$root/bench/torch_peer.py" "$what" --compile --compile-backend "$compile_backend" \
      --compile-mode "$mode" "${common[@]}" --batch-sizes "$batches" --json "$res/$tag.json"
    files+=("$res/$tag.json")
  done
}

# serve_client: the interpreter bench/serve_load.py runs under, with tritonclient's HTTP client. On the GPU the
# machine's own with the carried wheels unpacked beside it (wheels are zip files; none of these needs installing);
# here the project's .venv, which holds them (the preflight's scratch venv has torch alone, and the script needs none).
need_serve_client() {
  if ((!gpu)); then serve_client=("$root/.venv/bin/python"); return 0; fi
  local lib=$work/pylib
  if [[ ! -f $lib/.unpacked ]]; then
    rm -rf "$lib"
    step unpack-serve-client "$py" -c 'import sys, zipfile
for w in sys.argv[2:]: zipfile.ZipFile(w).extractall(sys.argv[1])' "$lib" "$root"/.deps/wheels/*.whl
    if ((last_rc == 0)); then touch "$lib/.unpacked"; fi
  fi
  serve_client=(env "PYTHONPATH=$lib" "$py")
}

# The JPEG set's training files linked 4 times over (hard links: no copies), with its validation files.
need_data_x4() {
  if [[ "$(cat "$jpegs_x4/.made-from" 2>/dev/null)" == "$(cat "$jpegs/.made-by" 2>/dev/null)" ]]; then return 0; fi
  rm -rf "$jpegs_x4"
  step --show 1 link-jpegs-x4 sh -c 'set -e; src=$1 dst=$2; mkdir -p "$dst"; cp -al "$src/val" "$dst/val"
    for d in "$src"/train/*/; do c=$(basename "$d"); mkdir -p "$dst/train/$c"
      for k in 1 2 3 4; do for f in "$d"*; do ln "$f" "$dst/train/$c/$k-$(basename "$f")"; done; done; done
    cp "$src/.made-by" "$dst/.made-from"' _ "$jpegs" "$jpegs_x4"
}

# ---------------------------------------------------------------------------------------------------- run
# Settings: the GPU's (the figures docs/PERFORMANCE.md predicts) or a dry run's (the CPU, tiny, seconds). The dry
# run trains ResNet-18, whose build and steps cost half of ResNet-50's: it rehearses the script, and the suite's
# own tests run ResNet-50's bottleneck blocks.
settings() {
  unit_filter='-Gpu.*'
  if ((!gpu && !do_build)); then unit_filter='CudaBuild.*'; fi
  if ((gpu)); then
    device=cuda arch=resnet50 size=224 big=256 train_batches=64,128,256 infer_batches=1,64,256
    amp=amp bf16=bf16 tf32=tf32 half=fp16 warmup=10 iterations=50 latency_iterations=200 files_iterations=60
    per_class=300 val_per_class=8 data_images=6000 data_images_1=1500 data_batch=256 example_steps=60
    example_epochs=6 example_workers=12 file_backends=synthetic,cpu,gpu compile_backend=inductor
    fused_batches=64,256 profile_steps=3 max_autotune_s=260 example_amp=--amp example_precision=amp
    serve_batch=32 serve_concurrency=1,4,16,64 serve_seconds=5 serve_warmup=1 gpunet0_side=320
    save_every=20 saves=3
  else
    device=cpu arch=resnet18 size=32 big=2 train_batches=2 infer_batches=1,2
    amp=fp32 bf16=fp32 tf32=fp32 half=fp32 warmup=1 iterations=2 latency_iterations=2 files_iterations=2
    per_class=10 val_per_class=4 data_images=24 data_images_1=8 data_batch=8 example_steps=2 example_epochs=1
    example_workers=1 file_backends=synthetic,cpu compile_backend=eager  # inductor's CPU code generation takes minutes
    fused_batches=2 profile_steps=1 max_autotune_s=300 example_amp='' example_precision=fp32
    serve_batch=2 serve_concurrency=1,2 serve_seconds=0.5 serve_warmup=0.25 gpunet0_side=32
    save_every=2 saves=1
  fi
}

run_stage() {
  local saved_stage=${stage:-} saved_res=${res:-}
  stage=$1 res=$work/results/$1
  rm -rf "$res"; mkdir -p "$res"
  say "== stage $stage${saved_stage:+ (for $saved_stage)}"
  local before=$failed s0=$SECONDS
  "stage_$stage"
  say "== stage $stage: $((failed - before)) failed, $((SECONDS - s0)) s"
  stage=$saved_stage res=$saved_res
}

# Debian's libraries: carried (.deps, unpacked into the build folder so .deps stays small enough to travel).
unpack_deps() {
  local stamp; stamp=$(ls -l "$root/.deps/debs" | sha1sum | cut -c1-16)
  if [[ "$(cat "$build/deps/.unpacked" 2>/dev/null)" != "$stamp" ]]; then
    rm -rf "$build/deps"; mkdir -p "$build/deps"
    ln -sfn "$root/.deps/debs" "$build/deps/debs"
    bash "$root/.deps/carry-debs.sh" unpack -o "$build/deps" >/dev/null || { say "FAIL unpacking .deps"; exit 1; }
    # zlib1g-dev's libz.so is an absolute link to Debian's libz.so.1.2.13, which another system lacks; CMake would
    # then take its libz.a, which is not position-independent and cannot go into the Python module. The machine's
    # own libz.so.1 (zlib keeps its ABI) is linked instead, compiled against the carried header.
    local lib=$build/deps/root/usr/lib/x86_64-linux-gnu z
    for z in /lib/x86_64-linux-gnu/libz.so.1 /usr/lib/x86_64-linux-gnu/libz.so.1 /usr/lib64/libz.so.1 ""; do
      if [[ -e $z ]]; then break; fi
    done
    [[ -n $z ]] || { say "FAIL unpacking .deps: this machine has no libz.so.1"; exit 1; }
    ln -sfn "$z" "$lib/libz.so"
    rm -f "$lib/libz.a"
    echo "$stamp" >"$build/deps/.unpacked"
  fi
}

run() {
  gpu=1 do_build=1
  if [[ ${1:-} == --dry ]]; then gpu=0 do_build=0; shift; fi
  # The preflight: builds for real, runs on the CPU.
  if [[ ${CONVNETS_GPU_SH_MODE:-} == preflight ]]; then gpu=0 do_build=1; fi
  (($#)) || usage
  local stages=() s
  for s in "$@"; do
    if [[ $s == all ]]; then stages+=("${STAGES[@]}"); continue; fi
    [[ " ${STAGES[*]} ${EXTRA_STAGES[*]} " == *" $s "* ]] ||
      die "run: unknown stage '$s' (expected: ${STAGES[*]} ${EXTRA_STAGES[*]} or all)"
    stages+=("$s")
  done

  out=${OUT:-$root/gpu-out}
  mkdir -p "$out"
  # Both appended to: the device tool's $OUT starts empty at each call, and two runs in one call add up.
  summary=$out/summary.txt summary_json=$out/summary.json
  # The GPU machine's 16 cores build in minutes, inside its 10-minute command; the preflight's 2 take longer.
  step_limit=300 build_limit=${CONVNETS_BUILD_LIMIT:-540} passed=0 failed=0 built=0 last_rc=0 compiled=1 stage='' res=''
  deadline=0
  if ((gpu)); then deadline=${CONVNETS_GPU_DEADLINE:-570}; fi
  settings
  if ((gpu)); then
    py=${CONVNETS_GPU_PYTHON:-python3}
    build=${CONVNETS_BUILD:-$root/build-gpu}
  else
    py=${CONVNETS_PYTHON:-$root/.venv/bin/python}
    build=${CONVNETS_BUILD:-$root/build}
  fi
  bin=$build work=$build/gpu-work frames_so=''
  jpegs=$work/imagenet_like jpegs_x4=$work/imagenet_like_x4
  mkdir -p "$work"
  build_frames
  # One interpreter start for what the build needs of torch: its CMake prefix, then LibTorch's folder and the CUDA
  # libraries of its wheels (nvidia/*/lib), what a RUNPATH would have named.
  local probe libs
  probe=$("$py" -c 'import glob, os, torch.utils
site = os.path.dirname(os.path.dirname(torch.__file__))
print(torch.utils.cmake_prefix_path)
print(":".join([os.path.join(site, "torch", "lib")] + sorted(glob.glob(os.path.join(site, "nvidia", "*", "lib")))))') ||
    die "$py cannot import torch (CONVNETS_GPU_PYTHON / CONVNETS_PYTHON name the interpreter)"
  { read -r torch_prefix; read -r libs; } <<<"$probe"
  deps_prefix=/usr
  if ((do_build)); then
    [[ -f $root/.deps/carry-debs.sh && -d $root/.deps/debs ]] || die "no .deps/: run scripts/gpu.sh prepare first (here)"
    unpack_deps
    deps_prefix=$build/deps/root/usr
    # LibTorch and its CUDA libraries, then Debian's.
    export LD_LIBRARY_PATH="$libs:$deps_prefix/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  fi

  local mode="GPU"
  if ((!gpu && do_build)); then mode="preflight (built for 9.0, run on the CPU)"; fi
  if ((!gpu && !do_build)); then mode="dry run (CPU, tiny sizes; GPU lines: what a GPU would run)"; fi
  local source="unknown"
  if [[ -d $root/.git ]]; then source=$(git -C "$root" describe --always --dirty 2>/dev/null || echo unknown)
  elif [[ -f $root/.deps/source.txt ]]; then source=$(cat "$root/.deps/source.txt"); fi
  say "== gpu.sh run ${stages[*]}: $mode, $(date -u +%Y-%m-%dT%H:%M:%SZ), source $source"
  if ((gpu)); then
    timeout 60 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | sed 's/^/   /' \
      >>"$summary" || true
  fi
  timeout 120 "$py" -c 'import sys, torch, torchvision; print("   python", sys.version.split()[0], "torch",
torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version(), "torchvision",
torchvision.__version__, "GPU", torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)' \
    >>"$summary" 2>&1 || true
  # What the build needs of the machine, said before anything is built: CMake, nvcc, the interpreter's headers.
  { echo "   $(cmake --version 2>&1 | head -1); nvcc: $(nvcc --version 2>&1 | tail -2 | head -1)"
    "$py" -c 'import os, sysconfig; h = os.path.join(sysconfig.get_paths()["include"], "Python.h")
print("   Python.h:", h if os.path.exists(h) else "missing (" + h + "): the python stage cannot build the module")'
  } >>"$summary" 2>&1 || true

  local t0=$SECONDS
  for s in "${stages[@]}"; do
    if [[ $s == build ]] && ((built)); then continue; fi
    run_stage "$s"
  done
  say "== gpu.sh run ${stages[*]}: $passed passed, $failed failed in $((SECONDS - t0)) s"
  ((failed == 0))
}

# _headers DEPS_PREFIX BUILD: fails naming each header of a carried package that the build read from /usr/include.
check_headers() {
  local deps=$1 build=$2
  (cd "$deps/include" && find . -type f -o -type l) | sed 's|^\./|/usr/include/|' >"$build/gpu-carried-headers.txt"
  ninja -C "$build" -t deps | awk -v list="$build/gpu-carried-headers.txt" '
    BEGIN { while ((getline line < list) > 0) carried[line] = 1 }
    ($1 in carried) && !seen[$1]++ { print "read from the system, not .deps: " $1; bad = 1 }
    END { if (!bad) print "every header of a carried package came from .deps"; exit bad }'
}

# ---------------------------------------------------------------------------------------------------- preflight
# The GPU machine builds against its own PyTorch (2.11.0+cu130, Python 3.12, torchvision 0.26), not the pinned
# 2.14.1: an API that differs ends its one hour at the build. This builds the same targets, the same way, against
# PyPI's torch 2.11.0 here and runs every stage (CPU, tiny sizes) on that build; then packs its binaries into .deps/
# (they carry no RUNPATH and link the same LibTorch build as the GPU machine's, so they run there without a build),
# and runs the stages again from those binaries alone, in a fresh folder, as the GPU machine will. The stages outside
# `all` (an open GPU issue's) are rehearsed too.
preflight() {
  local keep=0
  if [[ ${1:-} == --keep ]]; then keep=1; fi
  local scratch=${PREFLIGHT_DIR:-/tmp/convnets-preflight}
  rm -rf "$scratch"; mkdir -p "$scratch"
  # Expanded now: the trap runs after this function's locals are gone.
  if ((!keep)); then trap "rm -rf '$scratch'" EXIT; fi
  [[ -d .deps/debs ]] || prepare
  rm -f .deps/prebuilt.tar.* .deps/prebuilt.txt
  local t0=$SECONDS
  echo "preflight: scratch environment $scratch/venv: torch==2.11.0 torchvision==0.26.0"
  /usr/bin/python3 -m venv "$scratch/venv"
  "$scratch/venv/bin/pip" install -q --disable-pip-version-check torch==2.11.0 torchvision==0.26.0 >"$scratch/pip.log" 2>&1 ||
    { tail -20 "$scratch/pip.log"; die "preflight: pip install failed"; }
  echo "preflight: pip $((SECONDS - t0)) s"
  # nvcc 13.0, as the GPU machine's: this machine's if it is one, else PyPI's (the nvvm wheel pinned to nvcc's own
  # release: pip's newest nvvm emits PTX that ptxas 13.0 rejects).
  local nvcc; nvcc=$(command -v nvcc || true)
  if [[ -z $nvcc ]] || ! "$nvcc" --version | grep -q 'release 13\.0'; then
    local toolkit
    toolkit=$("$scratch/venv/bin/python" -c 'import importlib.metadata as m
print(next((r.split(";")[0].split("==")[1] for r in m.requires("torch") if r.startswith("cuda-toolkit")), "13.0.2"))')
    "$scratch/venv/bin/pip" install -q "cuda-toolkit[nvcc,crt,cccl,cudart]==$toolkit" nvidia-nvvm==13.0.88 \
      >>"$scratch/pip.log" 2>&1 || { tail -20 "$scratch/pip.log"; die "preflight: pip install of nvcc failed"; }
    local site; site=$("$scratch/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    ./scripts/cuda-from-wheels.sh "$site" "$scratch/cuda"
    nvcc=$scratch/cuda/bin/nvcc
  fi
  echo "preflight: $("$nvcc" --version | tail -2 | head -1)"
  # Hashed before the build: a source edited while it runs must not be credited to these binaries.
  local rc=0 out=${OUT:-$root/gpu-out/preflight} sources; sources=$(sources_id)
  local vars=(CONVNETS_GPU_SH_MODE=preflight CONVNETS_PYTHON="$scratch/venv/bin/python" CONVNETS_NVCC="$nvcc"
             CONVNETS_BUILD_LIMIT="${CONVNETS_BUILD_LIMIT:-3600}")
  env "${vars[@]}" CONVNETS_BUILD="$scratch/build" CONVNETS_GPU_PREBUILT=no OUT="$out/native" \
    "$root/scripts/gpu.sh" run all "${EXTRA_STAGES[@]}" || rc=$?
  if ((rc == 0)); then
    # The binaries, stripped, and what they were made from and against.
    mkdir -p "$scratch/prebuilt/tests"
    local t
    for t in "${TARGETS[@]}"; do strip --strip-unneeded -o "$scratch/prebuilt/$t" "$scratch/build/$t"; done
    tar -czf .deps/prebuilt.tar.gz -C "$scratch/prebuilt" .
    { torch_id "$scratch/venv/bin/python"; echo "sources $sources"
      echo "made by gpu.sh preflight, $(git describe --always --dirty 2>/dev/null), $(date -u +%Y-%m-%dT%H:%MZ)"; } \
      >.deps/prebuilt.txt
    echo "preflight: .deps/prebuilt.tar.gz $(du -h .deps/prebuilt.tar.gz | cut -f1)"
    env "${vars[@]}" CONVNETS_BUILD="$scratch/build-prebuilt" OUT="$out/prebuilt" \
      "$root/scripts/gpu.sh" run build tests data train infer "${EXTRA_STAGES[@]}" || rc=$?
    if ! grep -q '^PASS build/prebuilt' "$out/prebuilt/summary.txt"; then
      echo "preflight: the second run did not use the prebuilt binaries" >&2
      rc=1
    fi
    carry_size || rc=$?
  fi
  if ((rc != 0)); then rm -f .deps/prebuilt.tar.gz .deps/prebuilt.txt; fi
  echo "preflight: $((SECONDS - t0)) s in all; $( ((rc == 0)) && echo PASSED || echo FAILED)" \
       "(summaries: $out/native/summary.txt, $out/prebuilt/summary.txt)"
  if ((keep)); then echo "preflight: kept $scratch"; fi
  return $rc
}

case ${1:-} in
prepare) prepare ;;
preflight) shift; preflight "$@" ;;
run) shift; run "$@" ;;
_headers) shift; check_headers "$@" ;;
_ran_on_gpu) shift; check_ran "$@" ;;
*) usage ;;
esac
