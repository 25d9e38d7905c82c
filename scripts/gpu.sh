#!/usr/bin/env bash
# The GPU machine's one call: build as CI does (CMakeLists.txt, CUDA on) against that machine's own PyTorch, run the GPU tests, benchmark convnets and PyTorch side by side.
#
#   here:  scripts/gpu.sh prepare      downloads the Debian build deps into .deps/ (git-ignored)
#   there: scripts/gpu.sh run          (device tool, carry [".deps"]); results in $OUT (or ./gpu-out)
#
# Environment: QUICK=1 runs batch 256 amp only (a short first check).
set -euo pipefail
cd "$(dirname "$0")/.."
case ${1:-} in
prepare)
  shared=${SHARED:-../shared}
  # carry-debs.sh's default set, plus the Gloo headers backend_gloo.cpp compiles with.
  "$shared/tools/carry-debs.sh" download -o .deps \
    libturbojpeg0 libturbojpeg0-dev libjpeg62-turbo libjpeg62-turbo-dev libpng16-16 libpng-dev zlib1g-dev \
    libspng0 libspng-dev nlohmann-json3-dev libcli11-dev libfmt9 libfmt-dev libgtest-dev libgmock-dev \
    libbenchmark1debian libbenchmark-dev libopencv-core406 libopencv-core-dev libopencv-imgproc406 \
    libopencv-imgproc-dev libtbb12 libgloo-dev
  cp "$shared/tools/carry-debs.sh" .deps/
  # The ImageNet-like set's source photographs (python3-skimage is not there).
  mkdir -p .deps/photos
  skdata=/usr/lib/python3/dist-packages/skimage/data  # Debian's python3-skimage
  for f in astronaut.png chelsea.png coffee.png rocket.jpg hubble_deep_field.jpg retina.jpg motorcycle_left.png ihc.png \
           camera.png coins.png; do cp "$skdata/$f" .deps/photos/; done
  echo "now: device run, carry [\".deps\"], command: scripts/gpu.sh run"
  exit 0 ;;
run) ;;
*) sed -n '2,7p' "$0"; exit 2 ;;
esac

out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
log() { echo "== $*" | tee -a "$out/summary.txt"; }
bash .deps/carry-debs.sh unpack -o .deps >/dev/null
deps=$PWD/.deps/root/usr
torch_prefix=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')
torch_lib=$(python3 -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
export LD_LIBRARY_PATH="$deps/lib/x86_64-linux-gnu:$torch_lib:${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$out/summary.txt"
python3 -c 'import torch, torchvision; print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version(), "torchvision", torchvision.__version__)' | tee -a "$out/summary.txt"

log "build"
start=$SECONDS
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$deps;$torch_prefix" \
  -DTORCH_CUDA_ARCH_LIST=9.0 -DCMAKE_CUDA_COMPILER="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)" \
  -DCONVNETS_PYTHON="$(command -v python3)" \
  >"$out/cmake.log" 2>&1 || { tail -40 "$out/cmake.log"; exit 1; }
ninja -C build-gpu convnets unit_tests data_tests >"$out/build.log" 2>&1 || { grep -A5 -m5 "error" "$out/build.log"; tail -20 "$out/build.log"; exit 1; }
log "built in $((SECONDS - start)) s: $(./build-gpu/convnets --version)"

log "GPU tests (the unit suites; GPU-only cases skip nowhere here)"
./build-gpu/tests/unit_tests --gtest_brief=1 2>&1 | tail -30 | tee -a "$out/summary.txt" || true
./build-gpu/tests/data_tests --gtest_brief=1 --gtest_filter='Normalize*' 2>&1 | tail -5 | tee -a "$out/summary.txt" || true

bench() {  # mode precision batches
  local mode=$1 p=$2 b=$3
  ./build-gpu/convnets bench "$mode" --arch resnet50 --precision "$p" --batch-sizes "$b" --json "$out/convnets-$mode-$p.json" \
    >>"$out/bench.log" 2>&1 || echo "convnets bench $mode $p failed (see bench.log)"
  python3 bench/torch_peer.py "$mode" --arch resnet50 --precision "$p" --batch-sizes "$b" \
    --json "$out/eager-$mode-$p.json" >>"$out/bench.log" 2>&1 || echo "peer eager $mode $p failed"
  local files=("$out/convnets-$mode-$p.json" "$out/eager-$mode-$p.json")
  if [[ $mode == train && $p == amp ]]; then
    python3 bench/torch_peer.py train --compile --arch resnet50 --precision "$p" --batch-sizes "$b" \
      --json "$out/compile-$mode-$p.json" >>"$out/bench.log" 2>&1 || echo "peer compile failed"
    files+=("$out/compile-$mode-$p.json")
  fi
  python3 bench/compare.py "${files[@]}" 2>&1 | tee -a "$out/summary.txt"
}
# Issue 9: training from JPEG files against the same step on synthetic data,
# for the CPU loader and the hybrid device decoder, with the stage breakdown;
# and the device decoder's kernels against their host loops (data_tests).
log "GPU data path"
jpegs=/tmp/imagenet_like  # 3,080 JPEGs: not under $OUT, which comes back
python3 scripts/make_imagenet_like.py "$jpegs" --train-per-class 300 --val-per-class 8 --sources .deps/photos \
  | tail -1 | tee -a "$out/summary.txt"
CONVNETS_IMAGENET_LIKE=$jpegs ./build-gpu/tests/data_tests --gtest_brief=1 --gtest_filter='DeviceDecode*' 2>&1 | tail -8 | tee -a "$out/summary.txt" || true
for b in cpu gpu; do
  ./build-gpu/convnets bench data "$jpegs" --train --data-backend "$b" --images 6000 --batch-size 256 2>&1 | tail -4 | tee -a "$out/summary.txt" || true
  ./build-gpu/convnets bench data "$jpegs" --train --data-backend "$b" --workers 1 --images 1500 2>&1 | grep images/s | sed "s/^/1 worker $b: /" | tee -a "$out/summary.txt" || true
done
./build-gpu/convnets bench train --arch resnet50 --precision amp --batch-sizes 256 --iterations 60 --data "$jpegs" \
  --data-backend synthetic,cpu,gpu --json "$out/convnets-train-files.json" 2>&1 | tail -12 | tee -a "$out/summary.txt" || true

# Issue 34: the Python package's loader with device="cuda" against its CPU path (the tests' Cuda class), and
# examples/train_pytorch.py fed by it, where this machine's interpreter has the headers to build the module.
log "Python package on CUDA"
if ninja -C build-gpu convnets_python >>"$out/build.log" 2>&1; then
  (cd tests/python && CONVNETS_BIN=../../build-gpu/convnets CONVNETS_SOURCE_DIR=../.. \
    CONVNETS_PYTHONPATH=../../build-gpu/python CONVNETS_IMAGENET_LIKE=$jpegs \
    python3 -m unittest -v test_python_package.Cuda 2>&1 | tail -6 | tee -a "$out/summary.txt") || true
  PYTHONPATH=build-gpu/python python3 examples/train_pytorch.py "$jpegs" --arch resnet50 --image-size 224 \
    --batch-size 256 --epochs 1 --max-steps 60 --device cuda --workers 12 2>&1 | tail -3 | tee -a "$out/summary.txt" || true
else
  echo "the Python module was not built (no Python headers here?): see build.log" | tee -a "$out/summary.txt"
fi

if [[ ${QUICK:-0} == 1 ]]; then
  log "bench (quick)"; bench train amp 256
else
  log "bench train"
  bench train amp 64,128,256
  bench train bf16 256
  bench train tf32 256
  log "bench infer"
  bench infer amp 1,64,256
  # Issue 7: GPUNet batch-1 fp16 latency, convnets against the same network in
  # PyTorch eager (bench/gpunet_reference.py, written from the spec; the
  # definition comes from convnets so nothing from shared/ has to travel).
  log "bench infer gpunet"
  for arch in gpunet-0 gpunet-d1; do
    ./build-gpu/convnets models --arch "$arch" --definition >"$out/$arch.json"
    ./build-gpu/convnets bench infer --arch "$arch" --precision amp --batch-sizes 1 --json "$out/convnets-infer-$arch.json" \
      >>"$out/bench.log" 2>&1 || echo "convnets bench infer $arch failed (see bench.log)"
    python3 bench/gpunet_reference.py --config "$out/$arch.json" --latency --batch-size 1 --precision fp16 \
      2>>"$out/bench.log" | tee -a "$out/summary.txt" || echo "peer gpunet $arch failed"
    grep -h '"' "$out/convnets-infer-$arch.json" | head -c 2000 >>"$out/summary.txt" || true
  done
fi
log "done in $((SECONDS - start)) s"
