#!/usr/bin/env bash
# The main job on its embedded default: set up, build, then train ResNet-8 on
# Debian's Fashion-MNIST on the CPU (recipes/fashion-mnist-resnet8.json: 8
# epochs, >= 91% test top-1 in under 10 minutes on 2 cores) and render the
# run's HTML report. Extra arguments go to `convnets train` (e.g. --epochs 2).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
workspace=runs/fashion-mnist-resnet8-$(date +%Y%m%d-%H%M%S)
start=$(date +%s)
./build/convnets train --recipe fashion-mnist-resnet8 --workspace "$workspace" "$@"
echo "train: $(( $(date +%s) - start )) s wall"
./build/convnets report "$workspace" -o "$workspace/report.html"
