#!/usr/bin/env bash
# Install every Debian package convnets needs (idempotent: quiet when all are
# present) and build it into ./build. Run as root or with sudo available.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  build-essential cmake ninja-build ccache pkg-config
  libtorch-dev                       # LibTorch 1.13 (CPU), the tensor engine
  libgloo-dev                        # Gloo headers: the c10d process group of data-parallel runs
  nlohmann-json3-dev libcli11-dev    # JSON headers (safetensors, reports), the CLI
  libjpeg62-turbo-dev libpng-dev zlib1g-dev  # JPEG (region + DCT-scaled decode), PNG, gzip IDX
  libonnx-dev libprotobuf-dev        # ONNX export: ONNX's protobuf schema and checker
  dataset-fashion-mnist              # the default training data (IDX, read in place)
  libgtest-dev libgmock-dev          # the C++ test suite
  python3 python3-torch python3-torchvision  # reference implementations the tests compare with
  python3-pil python3-numpy python3-skimage  # PIL decode reference; skimage's photos feed the JPEG test set
  python3-opencv python3-onnx        # OpenCV's DNN runs the exported ONNX graphs in the tests
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""
  if [[ $(id -u) -ne 0 ]]; then sudo=sudo; fi
  echo "setup: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

build_type=${CONVNETS_BUILD_TYPE:-Release}
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE="$build_type" >/dev/null
cmake --build build
