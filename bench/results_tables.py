#!/usr/bin/env python3
"""docs/PERFORMANCE.md's GPU tables, made from the runs' own data: each bench/results/DATE-GPU/summary.json (a list of
{"figure", "convnets", "peer", "peer_value", "ratio", "unit", "command"} cells, one per measured figure against a
peer of the same call: bench/compare.py --summary writes them on the GPU machine) becomes one markdown table, placed
in the document between

    <!-- results: bench/results/DATE-GPU/summary.json -->
    ...
    <!-- end results -->

  results_tables.py [--doc docs/PERFORMANCE.md] --check    exit 1, naming each table that differs from its data
  results_tables.py [--doc docs/PERFORMANCE.md] --write    rewrite those tables from their data
  results_tables.py bench/results/DATE-GPU/summary.json     print one table
"""
import argparse
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEYS = ("figure", "convnets", "peer", "peer_value", "ratio", "unit", "command")
BLOCK = re.compile(r"(<!-- results: (?P<path>\S+) -->\n)(?P<body>.*?)(<!-- end results -->)", re.DOTALL)


def load(path):
    with open(path) as f:
        cells = json.load(f)
    if not isinstance(cells, list):
        raise ValueError("%s: a summary is a JSON list of cells" % path)
    for i, c in enumerate(cells):
        if not isinstance(c, dict) or set(c) != set(KEYS):
            raise ValueError("%s: cell %d must have exactly the keys %s" % (path, i, ", ".join(KEYS)))
        if not c["peer_value"] or abs(c["ratio"] - c["convnets"] / c["peer_value"]) > 1e-6 * abs(c["ratio"]):
            raise ValueError("%s: cell %d (%s vs %s): ratio %r is not convnets / peer_value" %
                             (path, i, c["figure"], c["peer"], c["ratio"]))
    return cells


def number(v, unit):
    if unit == "ms":
        return "%.3f" % v if v < 10 else "%.2f" % v
    return "{:,.0f}".format(v) if v >= 100 else "%.1f" % v


def table(cells):
    """One row per cell, in the file's order: what was measured, convnets, the peer, and the ratio."""
    lines = ["| figure | unit | convnets | peer | peer's | convnets / peer |", "|---|---|---:|---|---:|---:|"]
    for c in cells:
        lines.append("| %s | %s | %s | %s | %s | %.2fx |" % (c["figure"], c["unit"], number(c["convnets"], c["unit"]),
                                                          c["peer"], number(c["peer_value"], c["unit"]), c["ratio"]))
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("summary", nargs="?", help="print this summary.json's table")
    p.add_argument("--doc", default=os.path.join(ROOT, "docs", "PERFORMANCE.md"))
    p.add_argument("--check", action="store_true")
    p.add_argument("--write", action="store_true")
    a = p.parse_args(argv)
    if a.summary:
        sys.stdout.write(table(load(a.summary)))
        return 0
    if not (a.check or a.write):
        p.error("give a summary.json, --check or --write")
    with open(a.doc) as f:
        doc = f.read()
    bad, seen = [], set()

    def replace(m):
        path = m.group("path")
        seen.add(os.path.normpath(path))
        want = table(load(os.path.join(ROOT, path)))
        if m.group("body") != want:
            bad.append(path)
        return m.group(1) + want + m.group(4)

    new = BLOCK.sub(replace, doc)
    results = os.path.join(ROOT, "bench", "results")
    unplaced = sorted(os.path.join("bench", "results", d, "summary.json") for d in os.listdir(results)
                      if os.path.isfile(os.path.join(results, d, "summary.json"))
                      and os.path.join("bench", "results", d, "summary.json") not in seen) if os.path.isdir(results) else []
    if a.write:
        if new != doc:
            with open(a.doc + ".tmp", "w") as f:
                f.write(new)
            os.replace(a.doc + ".tmp", a.doc)
        for path in bad:
            print("rewrote the table of %s" % path)
    else:
        for path in bad:
            print("%s: its table in %s differs from the data (bench/results_tables.py --write)" % (path, a.doc))
    for path in unplaced:
        print("%s has no table in %s: add <!-- results: %s --> and <!-- end results --> where it belongs" %
              (path, a.doc, path))
    return 1 if (bad and a.check) or unplaced else 0


if __name__ == "__main__":
    sys.exit(main())
