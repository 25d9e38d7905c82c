#!/usr/bin/env bash
# Set up everything convnets needs and build it into ./build (idempotent;
# quiet when everything is present). Run as root or with sudo available.
#   1. Debian packages: compilers, the libraries convnets links, the test data.
#   2. .venv (git-ignored): the pinned engine from PyPI (torch's CUDA wheel,
#      whose LibTorch convnets links, and nvcc of the same CUDA version) and
#      the Python references and peers of the tests (scripts/requirements.txt).
#   3. CMake + Ninja against that LibTorch, CUDA compiled and linked in.
# Arguments (optional): a build directory other than ./build, then extra CMake
# arguments for it (scripts/sanitize.sh: build-asan/ with the sanitizer flags).
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  build-essential cmake ninja-build ccache pkg-config
  python3 python3-venv               # the interpreter of .venv
  python3-dev                        # Python.h: torch.compile (a peer in bench/) compiles its CPU kernels against it
  libgloo-dev                        # Gloo headers for c10d's ProcessGroupGloo.hpp (src/distributed/backend_gloo.cpp says why these fit)
  nlohmann-json3-dev libcli11-dev    # JSON headers (safetensors, reports), the CLI
  libjpeg62-turbo-dev libpng-dev zlib1g-dev  # JPEG (region + DCT-scaled decode), PNG, gzip IDX
  libonnx-dev libprotobuf-dev        # ONNX export: ONNX's protobuf schema and checker
  dataset-fashion-mnist              # the default training data (IDX, read in place)
  libboost-dev                       # Boost.Beast and Asio (header-only): convnets serve's HTTP front end
  libgrpc++-dev protobuf-compiler-grpc protobuf-compiler  # serve --grpc-port: Triton's gRPC service, its .proto compiled
  libgtest-dev libgmock-dev          # the C++ test suite
  clang                              # libFuzzer for the fuzz targets (scripts/fuzz.sh)
  python3-skimage                    # real photographs (its data folder) for the ImageNet-like JPEG set
)

# Each part says what it does and how long it took, and is skipped when what it makes is already there.
started=$SECONDS
part_started=$SECONDS
done_part() { echo "setup: $1 ($((SECONDS - part_started)) s)"; part_started=$SECONDS; }

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
  done_part "Debian packages: installed ${#missing[@]}"
else
  done_part "Debian packages: all ${#packages[@]} present"
fi

# Debian's interpreter, not whichever python3 comes first on PATH.
venv=$PWD/.venv
requirements=scripts/requirements.txt
nodeps=scripts/requirements-nodeps.txt
if [[ ! -x $venv/bin/python ]] || ! cmp -s "$requirements" "$venv/requirements.installed" ||
   ! cmp -s "$nodeps" "$venv/requirements-nodeps.installed"; then
  echo "setup: installing the Python environment .venv ($requirements, $nodeps; about 5.5 GB the first time)"
  [[ -x $venv/bin/python ]] || /usr/bin/python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check --no-input -r "$requirements"
  "$venv/bin/pip" install --quiet --disable-pip-version-check --no-input --no-deps -r "$nodeps"
  cp "$requirements" "$venv/requirements.installed"
  cp "$nodeps" "$venv/requirements-nodeps.installed"
  done_part "Python environment .venv: installed"
else
  done_part "Python environment .venv: up to date with $requirements and $nodeps"
fi

# The wheels' CUDA (nvidia/cu13) laid out as a toolkit, for CMake and nvcc.
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
cuda=$venv/cuda
./scripts/cuda-from-wheels.sh "$site" "$cuda"

torch_prefix=$("$venv/bin/python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
build_type=${CONVNETS_BUILD_TYPE:-Release}
build=${1:-build}
configure=(cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE="$build_type" -DCMAKE_PREFIX_PATH="$torch_prefix"
  -DCMAKE_CUDA_COMPILER="$cuda/bin/nvcc" -DCUDAToolkit_ROOT="$cuda" -DCUDA_TOOLKIT_ROOT_DIR="$cuda"
  -DCONVNETS_PYTHON="$venv/bin/python" "${@:2}")
# A configured tree with the same arguments reconfigures itself when a CMakeLists.txt changes (ninja's rule), so
# the explicit configure (10-20 s of finding LibTorch and CUDA) runs only for a new tree or new arguments.
stamp=$build/.setup-configure-args
if [[ -f $build/build.ninja ]] && [[ "$(cat "$stamp" 2>/dev/null)" == "${configure[*]}" ]]; then
  done_part "CMake: $build already configured with these arguments"
else
  "${configure[@]}" >/dev/null
  echo "${configure[*]}" >"$stamp"
  done_part "CMake: configured $build"
fi
cmake --build "$build"
done_part "build: $build up to date"

# `import convnets` in .venv: the package as the build stages it (the .py
# files linked from python/convnets, the extension module beside them), so a
# rebuild is all a change needs. Only for ./build, the build the README uses.
if [[ $build == build ]]; then
  if ! ls "$build"/python/convnets/_convnets.*.so >/dev/null 2>&1; then
    echo "setup: the Python module was not built (see CMake's warning above)" >&2
    exit 1
  fi
  echo "$PWD/$build/python" >"$site/convnets-build.pth"
fi
echo "setup: ready in $((SECONDS - started)) s"
