#!/usr/bin/env python3
"""Side-by-side table of `convnets bench` and bench/torch_peer.py JSON results from one run: images/s, latency, ratios.

With --summary FILE each measured cell (a batch size against one peer) is also appended to FILE, a JSON list of
{"figure", "convnets", "peer", "peer_value", "ratio", "unit", "command"}: the format of bench/results/DATE-GPU/
summary.json, from which docs/PERFORMANCE.md's GPU tables are made (bench/results_tables.py). ratio is always
convnets / peer in the cell's unit: above 1 is faster for img/s, below 1 is faster for ms.
"""
import argparse
import json
import os
import re
import sys


def load(spec):
    """A results file, optionally as LABEL=PATH: LABEL names the column instead of the file's tool."""
    label, sep, path = spec.partition("=")
    if not sep or not label or os.path.exists(spec):
        label, path = None, spec
    with open(path) as f:
        run = json.load(f)
    run["label"] = label or run.get("tool", "?")
    return run


def short(command):
    """A command as provenance: files by their names, not by where one machine kept them."""
    return re.sub(r"(?<![\w.])/\S*/([^/\s]+)", r"\1", command)


def cells(ours, peers, figure_note):
    """The summary cells of one comparison, in table order."""
    out = []
    infer = ours["mode"] == "infer"
    what = "%s %s %s" % (ours["mode"], ours["arch"], ours["precision"])
    for row in ours["rows"]:
        if row.get("data_backend", "synthetic") != "synthetic" or not row.get("fits", True):
            continue
        b = row["batch"]
        for r in peers:
            o = next((x for x in r["rows"] if x["batch"] == b and x.get("fits", True)), None)
            if not o:
                continue
            command = short("%s | %s" % (ours.get("command", "convnets bench %s" % ours["mode"]),
                                         r.get("command", r["label"])))
            figure = "%s, batch %d%s" % (what, b, ", " + figure_note if figure_note else "")
            out.append({"figure": figure, "convnets": row["images_per_s"], "peer": r["label"],
                        "peer_value": o["images_per_s"], "ratio": row["images_per_s"] / o["images_per_s"],
                        "unit": "img/s", "command": command})
            if infer:
                out.append({"figure": figure + ", latency", "convnets": row["mean_ms"], "peer": r["label"],
                            "peer_value": o["mean_ms"], "ratio": row["mean_ms"] / o["mean_ms"], "unit": "ms",
                            "command": command})
    return out


def append_summary(path, new):
    existing = []
    if os.path.exists(path):
        with open(path) as f:
            existing = json.load(f)
        if not isinstance(existing, list):
            sys.exit("compare: %s is not a summary (a JSON list of cells)" % path)
    with open(path + ".tmp", "w") as f:
        json.dump(existing + new, f, indent=1)
        f.write("\n")
    os.replace(path + ".tmp", path)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", nargs="+", help="JSON files; the convnets one first, then its peers ([LABEL=]PATH)")
    p.add_argument("--summary", help="append each cell to this JSON list (bench/results/DATE-GPU/summary.json)")
    p.add_argument("--figure-note", default="", help="added to each cell's figure name (e.g. 'synthetic data')")
    a = p.parse_args(argv)
    runs = [load(s) for s in a.results]
    ours, peers = runs[0], runs[1:]
    if ours.get("tool") != "convnets":
        sys.exit("compare: the first file must be convnets' (tool=convnets), got %r" % ours.get("tool"))
    for r in peers:
        for key in ("mode", "precision", "image_size"):
            if r.get(key) != ours.get(key):
                sys.exit("compare: %s differs: convnets %r, %s %r" % (key, ours.get(key), r["label"], r.get(key)))
    infer = ours["mode"] == "infer"
    print("%s %s %s %dpx on %s" % (ours["mode"], ours["arch"], ours["precision"], ours["image_size"], ours["device"]))
    head = ["batch", "convnets img/s"] + ["%s img/s" % r["label"] for r in peers] + ["x %s" % r["label"] for r in peers]
    if infer:
        head += ["convnets ms"] + ["%s ms" % r["label"] for r in peers] + ["latency / %s" % r["label"] for r in peers]
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
        out = [str(b), "%.1f" % row["images_per_s"]]
        out += ["%.1f" % o["images_per_s"] if o else "-" for o in others]
        out += ["%.2fx" % (row["images_per_s"] / o["images_per_s"]) if o else "-" for o in others]
        if infer:
            out += ["%.3f" % row["mean_ms"]] + ["%.3f" % o["mean_ms"] if o else "-" for o in others]
            out += ["%.2f" % (row["mean_ms"] / o["mean_ms"]) if o else "-" for o in others]
        print("| " + " | ".join(out) + " |")
    # Peak GPU memory at each batch (convnets' rows and its own variants): where a smaller peak at the same batch
    # leaves room, a larger batch fits.
    for run in [ours] + [r for r in peers if r.get("tool") == "convnets"]:
        peaks = ["batch %d: %.0f MiB" % (x["batch"], x["peak_memory_mb"]) for x in run["rows"] if "peak_memory_mb" in x]
        if peaks:
            print("peak memory, %s: %s" % (run["label"], ", ".join(peaks)))
    if a.summary:
        append_summary(a.summary, cells(ours, peers, a.figure_note))


if __name__ == "__main__":
    main()
