#!/usr/bin/env bash
# The main job on its embedded default: set up, build, list the model zoo and
# run a ResNet-50 v1.5 forward pass on CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
./build/convnets models
echo
./build/convnets models --arch resnet50 --forward --batch-size 8
