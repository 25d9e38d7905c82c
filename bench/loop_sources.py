#!/usr/bin/env python3
"""The same PyTorch training loop (examples/train_pytorch.py) fed three ways, side by side: convnets.data.Loader,
one synthetic batch on the device (the step alone) and torchvision's ImageFolder + DataLoader. Reads the runs'
--json summaries, prints the table and appends its cells to a summary.json (bench/compare.py's format): convnets'
loader against each of the other two.

  loop_sources.py CONVNETS.json SYNTHETIC.json TORCHVISION.json [--summary summary.json]
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare  # noqa: E402  (its summary writer)

PEERS = {"synthetic": "the same loop on one synthetic batch", "torchvision": "the same loop on torchvision's DataLoader"}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs=3, metavar="JSON", help="the convnets, synthetic and torchvision runs, in that order")
    p.add_argument("--summary")
    a = p.parse_args(argv)
    runs = []
    for path, want in zip(a.runs, ("convnets", "synthetic", "torchvision")):
        with open(path) as f:
            r = json.load(f)
        if r.get("loader") != want:
            sys.exit("loop_sources: %s is the %r loader's run, expected %r" % (path, r.get("loader"), want))
        runs.append(r)
    ours = runs[0]
    for r in runs[1:]:
        for key in ("arch", "amp", "batch_size", "world_size"):
            if r.get(key) != ours.get(key):
                sys.exit("loop_sources: %s differs: convnets %r, %s %r" % (key, ours.get(key), r["loader"], r.get(key)))
    precision = "amp" if ours["amp"] else "fp32"
    print("examples/train_pytorch.py, %s %s, batch %d, training img/s (validation excluded)" %
          (ours["arch"], precision, ours["batch_size"]))
    print("| loader | img/s | convnets.data.Loader / it |")
    print("|:---|---:|---:|")
    for r in runs:
        print("| %s | %.1f | %.2fx |" % (r["loader"], r["train_img_per_s"], ours["train_img_per_s"] / r["train_img_per_s"]))
    if a.summary:
        cells = [{"figure": "examples/train_pytorch.py %s %s, batch %d, convnets.data.Loader" %
                            (ours["arch"], precision, ours["batch_size"]),
                  "convnets": ours["train_img_per_s"], "peer": PEERS[r["loader"]], "peer_value": r["train_img_per_s"],
                  "ratio": ours["train_img_per_s"] / r["train_img_per_s"], "unit": "img/s",
                  "command": "python3 examples/train_pytorch.py DATA --arch %s --batch-size %d%s --loader convnets|%s"
                             % (ours["arch"], ours["batch_size"], " --amp" if ours["amp"] else "", r["loader"])}
                 for r in runs[1:]]
        compare.append_summary(a.summary, cells)


if __name__ == "__main__":
    main()
