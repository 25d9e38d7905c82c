#!/usr/bin/env python3
"""The headline table (docs/headline.json) rendered into README.md and docs/PERFORMANCE.md, between the lines
`<!-- headline:begin -->` and `<!-- headline:end -->`, so that the two cannot disagree with each other or with
the data: a GPU cell's figures are computed here from the run's bench/results/RUN/summary.json rows it names, a CPU
cell's must be in the lines it quotes from the PERFORMANCE.md section it names.

    scripts/headline.py          # rewrite the table in both files
    scripts/headline.py --check  # exit 1, naming the file and each row, where either differs from what the data gives

--root DIR reads (and rewrites) README.md, docs/ and bench/results/ under DIR instead of this checkout's, as the
tests do on an edited copy.
"""
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the data's root: main()'s --root sets it
sys.path.insert(0, os.path.join(ROOT, "bench"))
import results_tables  # noqa: E402 - the summaries' one reader
BEGIN, END = "<!-- headline:begin -->", "<!-- headline:end -->"
TARGETS = {"README.md": "", "docs/PERFORMANCE.md": "../"}  # file -> its way back to the root, for links


class HeadlineError(Exception):
    pass


def summary(run):
    """The run's cells, read and checked by bench/results_tables.py, which draws the runs' own tables."""
    path = os.path.join(ROOT, "bench", "results", run, "summary.json")
    try:
        return results_tables.load(path)
    except (OSError, ValueError) as e:
        raise HeadlineError(f"{path}: {e}")


def value(rows, pick, run):
    """A row's convnets figure, or the named peer's (a convnets variant is one of the row's peers)."""
    found = [r for r in rows if r["figure"] == pick["figure"] and ("peer" not in pick or r["peer"] == pick["peer"])]
    if "peer" not in pick:
        found = found[:1]  # the convnets figure is on each of its peers' rows: any one
    if len(found) != 1:
        raise HeadlineError(f"bench/results/{run}/summary.json: {len(found)} rows for {pick}, expected one")
    row = found[0]
    return (row["peer_value"] if "peer" in pick else row["convnets"]), row["unit"]


def number(v, unit):
    return f"{v:,.0f} img/s" if unit == "img/s" else f"{v:.3f} ms" if unit == "ms" else f"{v:g} {unit}"


def gpu_cell(cell, back):
    rows = summary(cell["run"])
    ours, unit = value(rows, cell["ours"], cell["run"])
    parts = []
    for peer in cell["theirs"]:
        theirs, peer_unit = value(rows, peer, cell["run"])
        if peer_unit != unit:
            raise HeadlineError(f"{cell['run']}: {peer} is in {peer_unit}, convnets' figure in {unit}")
        speed = theirs / ours if unit == "ms" else ours / theirs  # above 1: convnets faster
        parts.append(f"**{speed:.2f}x** {peer['name']}")
    text = number(ours, unit) + ": " + ", ".join(parts)
    if cell.get("note"):
        text += f" ({cell['note']})"
    gpu = cell["run"].split("-", 3)[3]
    date = cell["run"][:10]
    return text, f"{gpu}, {date} ([data]({back}bench/results/{cell['run']}/summary.json))"


def figure_pattern(figure):
    """The figure as a whole number: "1.00x" is not the end of "11.00x"."""
    return re.compile(r"(?<![\d.])" + re.escape(figure) + r"(?!\d)")


def cpu_cell(cell, performance):
    start = performance.find("\n" + cell["section"] + "\n")
    if start < 0:
        raise HeadlineError(f"docs/PERFORMANCE.md has no section '{cell['section']}'")
    rest = performance[start + 1:]
    nxt = rest.find("\n## ", 1)
    section = rest if nxt < 0 else rest[:nxt]
    # Whitespace as the page wraps it does not matter; the words do.
    flat = " ".join(section.split())
    quotes = [" ".join(q.split()) for q in cell["quotes"]]
    for quote in quotes:
        if quote not in flat:
            raise HeadlineError(f"docs/PERFORMANCE.md, section '{cell['section']}', does not say: {quote}")
    text = cell["text"]
    for figure in cell["figures"]:
        if not any(figure_pattern(figure).search(q) for q in quotes):
            raise HeadlineError(f"docs/headline.json: {figure} is in none of its cell's quotes")
        text, n = figure_pattern(figure).subn(f"**{figure}**", text, count=1)
        if n != 1:
            raise HeadlineError(f"docs/headline.json: the text '{cell['text']}' does not hold its figure {figure}")
    return text, cell["machine"]


def render(back, performance):
    with open(os.path.join(ROOT, "docs", "headline.json")) as f:
        table = json.load(f)["rows"]
    lines = ["| What | Against | convnets | Machine, date |", "|---|---|---|---|"]
    for row in table:
        if "gpu" in row:
            text, where = gpu_cell(row["gpu"], back)
        elif "cpu" in row:
            text, where = cpu_cell(row["cpu"], performance)
        else:
            text, where = row["none"], "-"
        lines.append(f"| {row['what']} | {row['peers']} | {text} | {where} |")
    return "\n".join(lines)


def differences(body, table, name):
    """Each row of the file's table that is not the data's, named by its first cell."""
    have, want = body.split("\n"), table.split("\n")
    out = []
    for i in range(max(len(have), len(want))):
        a, b = (have[i] if i < len(have) else ""), (want[i] if i < len(want) else "")
        if a != b:
            what = (a or b).strip("|").split(" | ")[0].strip()
            out.append(f"{name}, row '{what}': the file has\n    {a or '(no row)'}\n"
                       f"  the data gives\n    {b or '(no row)'}")
    return out


def split(text, name):
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise HeadlineError(f"{name}: expected one '{BEGIN}' line, then one '{END}' line")
    head, rest = text.split(BEGIN, 1)
    body, tail = rest.split(END, 1)
    return head, body.strip("\n"), tail


def main(argv):
    global ROOT
    args = argv[1:]
    if args[:1] == ["--root"] and len(args) >= 2:
        ROOT, args = os.path.abspath(args[1]), args[2:]
    elif args[-2:-1] == ["--root"]:
        ROOT, args = os.path.abspath(args[-1]), args[:-2]
    check = args == ["--check"]
    if args not in ([], ["--check"]):
        print(__doc__, file=sys.stderr)
        return 2
    try:
        with open(os.path.join(ROOT, "docs", "PERFORMANCE.md")) as f:
            performance = f.read()
        stale, rows = [], []
        for name, back in TARGETS.items():
            path = os.path.join(ROOT, name)
            with open(path) as f:
                text = f.read()
            head, body, tail = split(text, name)
            table = render(back, performance)
            if body != table:
                if check:
                    stale.append(name)
                    rows += differences(body, table, name)
                else:
                    with open(path, "w") as f:
                        f.write(head + BEGIN + "\n" + table + "\n" + END + tail)
        if stale:
            raise HeadlineError(", ".join(stale) + ": the headline table differs from docs/headline.json and its "
                                "data; run scripts/headline.py\n" + "\n".join(rows))
    except HeadlineError as e:
        print(f"headline: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
