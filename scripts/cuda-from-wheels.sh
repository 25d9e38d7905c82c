#!/usr/bin/env bash
# Lays out the CUDA of PyPI's nvidia wheels (site-packages/nvidia/cu13, from
# cuda-toolkit[nvcc,crt,cccl,cudart]) as a toolkit folder CMake and nvcc accept.
#   scripts/cuda-from-wheels.sh SITE_PACKAGES DEST     (DEST/bin/nvcc afterwards)
# Used by scripts/setup.sh (DEST .venv/cuda) and by the pip build backend
# (python/convnets_build.py) for a virtual environment of the user's.
#
# lib64/ gets the unversioned names a linker looks for (the wheels ship only
# libcudart.so.13 and the like), and nvcc itself is a hard link (a copy across
# file systems) rather than a symbolic one, because nvcc finds its profile,
# headers and lib64/ relative to the path it runs from once links are resolved.
# Quiet and quick when DEST is already up to date.
set -euo pipefail
site=${1:?usage: cuda-from-wheels.sh SITE_PACKAGES DEST}
cuda=${2:?usage: cuda-from-wheels.sh SITE_PACKAGES DEST}
wheel_cuda=$site/nvidia/cu13
if [[ ! -x $wheel_cuda/bin/nvcc ]]; then
  echo "cuda-from-wheels.sh: no nvcc in $wheel_cuda: pip install \"cuda-toolkit[nvcc,crt,cccl,cudart]\" of torch's CUDA version" >&2
  exit 1
fi
if [[ -x $cuda/bin/nvcc && -e $cuda/lib64/libcudart.so && ! $cuda/bin/nvcc -ot $wheel_cuda/bin/nvcc ]]; then
  exit 0
fi
rm -rf "$cuda"
mkdir -p "$cuda/bin" "$cuda/lib64"
for d in include nvvm; do ln -s "$wheel_cuda/$d" "$cuda/$d"; done
for f in "$wheel_cuda"/bin/*; do ln -s "$f" "$cuda/bin/"; done
rm "$cuda/bin/nvcc"
ln "$wheel_cuda/bin/nvcc" "$cuda/bin/nvcc" 2>/dev/null || cp "$wheel_cuda/bin/nvcc" "$cuda/bin/nvcc"
for f in "$wheel_cuda"/lib/*.so.* "$wheel_cuda"/lib/*.a; do
  b=$(basename "$f")
  ln -s "$f" "$cuda/lib64/$b"
  if [[ $b == *.so.* ]]; then ln -sf "$f" "$cuda/lib64/${b%%.so.*}.so"; fi
done
