#!/usr/bin/env bash
# Make .venv-triton (git-ignored): Triton Inference Server's own server from PyPI (nvidia-pytriton, whose wheel ships
# tritonserver and its Python backend) with OpenVINO, pinned in scripts/requirements-triton.txt; the peer
# bench/serve_vs_triton.py measures `convnets serve` against. Idempotent: quiet when it is up to date.
# The benchmark, not the test suite, needs it; scripts/setup.sh (Debian's python3, python3-venv) comes first.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=$PWD/.venv-triton
requirements=scripts/requirements-triton.txt
# Debian 12's interpreter: the wheel's Python-backend stub for 3.11 links /lib/x86_64-linux-gnu/libpython3.11.so.1.0.
python=/usr/bin/python3.11
if [[ ! -x $python ]] || [[ ! -e /lib/x86_64-linux-gnu/libpython3.11.so.1.0 ]]; then
  echo "triton-env: $python and libpython3.11 are needed (Debian 12's python3 and libpython3.11)" >&2
  exit 1
fi
if [[ -x $venv/bin/python ]] && cmp -s "$requirements" "$venv/requirements.installed"; then
  echo "triton-env: $venv is up to date with $requirements"
  exit 0
fi
echo "triton-env: installing $venv from $requirements"
[[ -x $venv/bin/python ]] || "$python" -m venv "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check --no-input --no-deps -r "$requirements"
server=$("$venv/bin/python" -c 'import os, pytriton; print(os.path.dirname(pytriton.__file__))')/tritonserver/bin/tritonserver
# Fails here, not in the middle of a benchmark, where the binary cannot find a library it links.
if ldd "$server" | grep -q "not found"; then
  echo "triton-env: $server cannot load:" >&2
  ldd "$server" | grep "not found" >&2
  exit 1
fi
cp "$requirements" "$venv/requirements.installed"
