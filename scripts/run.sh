#!/usr/bin/env bash
# The main job on its embedded default: set up, build, then train ResNet-10s on
# Debian's Fashion-MNIST on the CPU (recipes/fashion-mnist-resnet10s.json,
# tuned on a held-out part of the training images: docs/history/cpu-training.md) and
# render the run's HTML report. Prints the test split's top-1 after the last
# epoch and the training wall time. Extra arguments go to `convnets train`
# (e.g. --epochs 2).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
recipe=fashion-mnist-resnet10s
workspace=runs/$recipe-$(date +%Y%m%d-%H%M%S)
mkdir -p runs
start=$(date +%s)
out=$workspace.out
# tee -i: a Ctrl-C reaches convnets, which saves last.safetensors, while tee
# keeps passing its output on.
./build/convnets train --recipe "$recipe" --workspace "$workspace" "$@" | tee -i "$out"
wall=$(( $(date +%s) - start ))
# Extra arguments may name another workspace, or make none (--print-config).
[ -d "$workspace" ] && mv "$out" "$workspace/train.out" && out=$workspace/train.out
# The last epoch's validation line is the test split's figure (the recipe
# validates on t10k; best.safetensors is chosen on it, so quote the last epoch).
last=$({ grep -E '^epoch [0-9]+/[0-9]+ val  top-1' "$out" || true; } | tail -n 1 | sed -E 's/.*top-1 ([0-9.]+%).*/\1/')
if [ -f "$workspace/log.json" ]; then
  ./build/convnets report "$workspace" -o "$workspace/report.html"  # prints its path
fi
case " $* " in
  *" --holdout"*|*" --val-data"*) split="held-out/validation" ;;  # not the test split then
  *) split="test" ;;
esac
echo "$split top-1 after the last epoch: ${last:-none (no validation ran)}; training wall time: $((wall / 60)) min $((wall % 60)) s"
