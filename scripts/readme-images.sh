#!/usr/bin/env bash
# Renders the README's pictures from a real run of ./scripts/run.sh: its HTML report's loss and top-1 charts
# and the confusion matrix of its best checkpoint on Fashion-MNIST's test split, as
# PNGs in docs/images/, through Debian's headless Chromium (installed here if absent: a maintainer's tool, not
# a build or test dependency). Usage: scripts/readme-images.sh [RUN_FOLDER] (default: the newest demo run).
set -euo pipefail
cd "$(dirname "$0")/.."
run=${1:-$(ls -d runs/fashion-mnist-resnet10s-* 2>/dev/null | sort | tail -n 1)}
[ -n "$run" ] && [ -f "$run/best.safetensors" ] || { echo "readme-images: no finished run (./scripts/run.sh makes one)" >&2; exit 1; }
command -v chromium >/dev/null || { apt-get update && apt-get install -y --no-install-recommends chromium; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
./build/convnets eval /usr/share/datasets/fashion-mnist --checkpoint "$run/best.safetensors" --per-class --json > "$tmp/eval.json"
./build/convnets report "$run" --eval "$tmp/eval.json" --title "convnets run: ResNet-10s on Fashion-MNIST" -o "$tmp/report.html"
# Pages of their own for the pictures: the report's loss and top-1 charts side by side, and its one SVG after
# the "Evaluation per class" heading, the confusion matrix.
python3 - "$tmp/report.html" "$tmp/charts.html" "$tmp/confusion.html" <<'PY'
import re, sys
html = open(sys.argv[1]).read()
page = '<html><body style="margin:0;background:#fff;display:flex;font-family:sans-serif">{}</body></html>'
charts = [re.search(r'<svg[^>]*aria-label="%s".*?</svg>' % name, html, re.S).group(0)
          for name in ("Loss", "Top-1 accuracy")]
open(sys.argv[2], "w").write(page.format("".join(charts)))
open(sys.argv[3], "w").write(page.format(re.search(r"Evaluation per class.*?(<svg.*?</svg>)", html, re.S).group(1)))
PY
shot() {  # FILE.html OUT.png WIDTH,HEIGHT
  chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --force-device-scale-factor=1 \
    --window-size="$3" --screenshot="$2" "file://$1" 2>/dev/null
}
shot "$tmp/charts.html" docs/images/report.png 1120,330
shot "$tmp/confusion.html" docs/images/confusion.png 640,490
ls -l docs/images/report.png docs/images/confusion.png
