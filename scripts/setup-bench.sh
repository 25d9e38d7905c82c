#!/usr/bin/env bash
# Installs the benchmark-only peers (scripts/requirements-bench.txt: NVIDIA DALI) into .venv, after
# scripts/setup.sh made it. Idempotent and quiet when they are present.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=$PWD/.venv
requirements=scripts/requirements-bench.txt
if [[ ! -x $venv/bin/python ]]; then
  echo "setup-bench: no .venv: run scripts/setup.sh first" >&2
  exit 1
fi
if ! cmp -s "$requirements" "$venv/requirements-bench.installed"; then
  echo "setup-bench: installing $requirements into .venv (about 0.5 GB)"
  "$venv/bin/pip" install --quiet --disable-pip-version-check --no-input -r "$requirements"
  cp "$requirements" "$venv/requirements-bench.installed"
fi
