#!/usr/bin/env python3
"""Side-by-side table of `convnets bench` and bench/torch_peer.py JSON results from one run: images/s, latency, ratios."""
import argparse
import json
import sys


def load(paths):
    return [json.load(open(p)) for p in paths]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("results", nargs="+", help="JSON files; the convnets one first, then its peers")
    a = p.parse_args(argv)
    runs = load(a.results)
    ours, peers = runs[0], runs[1:]
    if ours.get("tool") != "convnets":
        sys.exit("compare: the first file must be convnets' (tool=convnets), got %r" % ours.get("tool"))
    for r in peers:
        for key in ("mode", "precision", "image_size"):
            if r.get(key) != ours.get(key):
                sys.exit("compare: %s differs: convnets %r, %s %r" % (key, ours.get(key), r.get("tool"), r.get(key)))
    infer = ours["mode"] == "infer"
    print("%s %s %s %dpx on %s" % (ours["mode"], ours["arch"], ours["precision"], ours["image_size"], ours["device"]))
    head = ["batch", "convnets img/s"] + ["%s img/s" % r["tool"] for r in peers] + ["x %s" % r["tool"] for r in peers]
    if infer:
        head += ["convnets ms"] + ["%s ms" % r["tool"] for r in peers] + ["latency / %s" % r["tool"] for r in peers]
    print("| " + " | ".join(head) + " |")
    print("|" + "---:|" * len(head))
    for row in ours["rows"]:
        b = row["batch"]
        if row.get("data_backend", "synthetic") != "synthetic":
            continue  # rows trained from files have no peer here; convnets prints their own table
        if not row.get("fits", True):
            print("| %d | out of memory (largest %d) |" % (b, row["largest_fitting"]))
            continue
        others = [next((x for x in r["rows"] if x["batch"] == b and x.get("fits", True)), None) for r in peers]
        cells = [str(b), "%.1f" % row["images_per_s"]]
        cells += ["%.1f" % o["images_per_s"] if o else "-" for o in others]
        cells += ["%.2fx" % (row["images_per_s"] / o["images_per_s"]) if o else "-" for o in others]
        if infer:
            cells += ["%.3f" % row["mean_ms"]] + ["%.3f" % o["mean_ms"] if o else "-" for o in others]
            cells += ["%.2f" % (row["mean_ms"] / o["mean_ms"]) if o else "-" for o in others]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
