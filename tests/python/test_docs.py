"""README.md and docs/ against what they describe (issue 61).

The README is a landing page: short, its first screen says what convnets is, the two commands and where to go,
and it holds no commit hashes or dated history (docs/ does). Its headline table is the one docs/PERFORMANCE.md
opens with, both rendered from docs/headline.json and the runs' data by scripts/headline.py. Every flag that a
command's `--help` lists is documented in README.md or a page of docs/ (PERFORMANCE.md is measurements, not a
manual): named in a sentence, list item or table cell that is more than a list of refusals. ReadmeCommands runs
every command the README shows, in order, as a user would after cloning, on the ImageNet-like JPEG fixture; a line
marked `# GPU` or `# download` is instead checked to parse. `scripts/headline.py --check` is shown failing on an
edited copy of the table and of its data.
"""
import ast
import functools
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

import runner

SOURCE = os.environ.get("CONVNETS_SOURCE_DIR", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
BIN = os.environ.get("CONVNETS_BIN", "")
IMAGENET_LIKE = os.environ.get("CONVNETS_IMAGENET_LIKE", "")
README = os.path.join(SOURCE, "README.md")
DOCS = os.path.join(SOURCE, "docs")
HELP_PAGES = [[], ["models"], ["train"], ["eval"], ["classify"], ["export"], ["pack"], ["report"], ["serve"],
              ["bench", "data"], ["bench", "train"], ["bench", "infer"]]
# CLI11's option lines: two spaces, the names joined by commas, then the type or the help text.
OPTION_LINE = re.compile(r"^  (--?[A-Za-z0-9][\w-]*(?:,--?[A-Za-z0-9][\w-]*)*)(?:\{[^}]*\})?(?=\s|$)")


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def without_headline(text):
    return re.sub(r"<!-- headline:begin -->.*?<!-- headline:end -->", "", text, flags=re.S)


def manual_text():
    """README.md and every page of docs/ but the measurements."""
    pages = [README] + [os.path.join(DOCS, f) for f in sorted(os.listdir(DOCS))
                        if f.endswith(".md") and f != "PERFORMANCE.md"]
    return "\n".join(read(p) for p in pages)


def help_options(text):
    """(long names, help text) of each option line of one `--help` page; CLI11 puts the help of a long option line
    on the lines below it, indented."""
    out, last = [], None
    for line in text.splitlines():
        m = OPTION_LINE.match(line)
        if m:
            last = [[n for n in m.group(1).split(",") if n.startswith("--")], line[m.end():].strip()]
            out.append(last)
        elif last and line.startswith("      ") and line.strip():
            last[1] = (last[1] + " " + line.strip()).strip()
        else:
            last = None
    return [tuple(o) for o in out]


def help_flags(text):
    """Each option line's long names, from one `--help` page."""
    return [names for names, _ in help_options(text)]


# A flag's --help text saying convnets refuses it (or some of its values).
REFUSED_HELP = re.compile(r"\brefused\b")
# A statement that only lists refusals, as the docs word them: "Refused by name: `--a` (...), `--b` (...)." or
# "`--a` and `--b` are refused." A flag named there is not documented by it, unless convnets refuses the flag itself.
REFUSAL_LIST = re.compile(r"^[-*\s]*(?:Refused(?: by name)?:|(?:`[^`]+`(?:,| and| or)?\s*)+(?:is|are) refused\b)")


@functools.lru_cache(maxsize=4)
def statements(text):
    """The text's sentences: of paragraphs, of list items, and of each table cell apart."""
    out, para = [], []

    def flush():
        out.extend(s for s in re.split(r"(?<=[.!?])\s+", " ".join(para)) if s.strip())
        para.clear()

    for line in text.splitlines():
        s = line.strip()
        if s.startswith("|"):
            flush()
            for cell in s.strip("|").split(" | "):
                para.append(cell.strip())
                flush()
        elif not s or s.startswith(("- ", "* ", "#", "```")) or re.match(r"\d+\. ", s):
            flush()
            if s:
                para.append(s)
        else:
            para.append(s)
    flush()
    return tuple(out)


def documented(flag, text, refused=False):
    """Whether the text says what `flag` (or its --no- form) does: it is named in a statement that is not only a
    list of refusals (REFUSAL_LIST); where convnets refuses the flag itself (`refused`), such a list says so."""
    names = {flag, "--no-" + flag[2:]} | ({"--" + flag[5:]} if flag.startswith("--no-") else set())
    return any(re.search(re.escape(n) + r"(?![\w-])", s) and (refused or not REFUSAL_LIST.match(s))
               for s in statements(text) for n in names)


class ReadmeShape(unittest.TestCase):
    def test_short_with_what_it_is_the_two_commands_and_where_next_first(self):
        lines = read(README).splitlines()
        self.assertLessEqual(len(lines), 220)
        first = "\n".join(lines[:40])
        self.assertRegex(first, r"convnets trains, evaluates")
        for needed in ("./scripts/run.sh", "./scripts/test.sh", "Where to go next"):
            self.assertIn(needed, first)
        # .ci/run calls exactly the README's test command.
        self.assertEqual([x for x in read(os.path.join(SOURCE, ".ci", "run")).splitlines()
                          if x.strip() and not x.startswith("#") and not x.startswith("set ")
                          and not x.startswith("cd ")], ["./scripts/test.sh"])

    def test_no_commit_hashes_or_dated_history(self):
        text = without_headline(read(README))
        self.assertEqual(re.findall(r"\b20\d\d-\d\d-\d\d\b", text), [])
        hashes = [h for h in re.findall(r"\b[0-9a-f]{7,40}\b", text) if re.search(r"[a-f]", h) and re.search(r"\d", h)]
        self.assertEqual(hashes, [])

    def test_every_link_and_page_it_names_exists(self):
        text = read(README)
        for target in re.findall(r"\]\(([^)#]+)\)", text) + re.findall(r"\b(docs/[\w.-]+\.(?:md|png))", text):
            with self.subTest(target=target):
                self.assertTrue(os.path.exists(os.path.join(SOURCE, target)), target)
        # Its own anchors, by GitHub's rule: the heading in lower case, punctuation dropped, spaces as hyphens.
        slugs = {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
                 for h in re.findall(r"^#+ (.+)$", text, re.M)}
        anchors = re.findall(r"\]\(#([^)]+)\)", text)
        self.assertGreater(len(anchors), 5)
        for anchor in anchors:
            self.assertIn(anchor, slugs, f"README.md links #{anchor}, which no heading makes")
        # The manual's pages link files beside them (docs/images/...) or other pages, relative to docs/.
        for page in os.listdir(DOCS):
            if page.endswith(".md"):
                for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", read(os.path.join(DOCS, page))):
                    with self.subTest(page=page, target=target):
                        self.assertTrue(os.path.exists(os.path.join(DOCS, target)), f"docs/{page} links {target}")
        # Each page of docs/ is in the manual's table.
        for page in os.listdir(DOCS):
            if page.endswith(".md"):
                self.assertIn(f"(docs/{page})", text, page + " is not linked from the README's manual table")

    def test_the_headline_table_is_the_datas_in_both_files(self):
        r = subprocess.run([sys.executable, os.path.join(SOURCE, "scripts", "headline.py"), "--check"],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        tables = [re.search(r"<!-- headline:begin -->\n(.*?)<!-- headline:end -->", read(p), re.S).group(1)
                  for p in (README, os.path.join(DOCS, "PERFORMANCE.md"))]
        self.assertGreater(tables[0].count("\n| "), 8)
        # The same rows; only the links differ (README.md is one folder up from docs/).
        self.assertEqual(tables[0], tables[1].replace("](../", "]("))
        performance = read(os.path.join(DOCS, "PERFORMANCE.md"))
        self.assertLess(performance.index("<!-- headline:begin -->"), performance.index("## Status"))

    def headline_copy(self):
        """What scripts/headline.py reads, in a temporary tree: README.md, docs/PERFORMANCE.md, docs/headline.json
        and the summaries of the runs it names. The copy as it is passes --check."""
        root = tempfile.mkdtemp(prefix="convnets-headline-")
        self.addCleanup(shutil.rmtree, root)
        with open(os.path.join(DOCS, "headline.json")) as f:
            rows = json.load(f)["rows"]
        runs = sorted({row["gpu"]["run"] for row in rows if "gpu" in row})
        self.assertTrue(runs, "docs/headline.json has no GPU row")
        for name in ["README.md", "docs/PERFORMANCE.md", "docs/headline.json",
                     *(f"bench/results/{run}/summary.json" for run in runs)]:
            os.makedirs(os.path.dirname(os.path.join(root, name)), exist_ok=True)
            shutil.copy(os.path.join(SOURCE, name), os.path.join(root, name))
        r = self.headline_check(root)
        self.assertEqual(r.returncode, 0, r.stderr)
        return root, next(row for row in rows if "gpu" in row)

    def headline_check(self, root):
        return subprocess.run([sys.executable, os.path.join(SOURCE, "scripts", "headline.py"), "--check",
                               "--root", root], capture_output=True, text=True, timeout=60)

    def replace_once(self, path, old, new):
        text = read(path)
        self.assertEqual(text.count(old), 1, f"{old!r} in {path}")
        with open(path, "w", encoding="utf-8") as f:
            f.write(text.replace(old, new))

    def gpu_cell(self, root, page, row):
        """The row's line in the page's table, its convnets figure and its first ratio (`5,665 img/s: **1.16x**`)."""
        line = next(x for x in read(os.path.join(root, page)).splitlines() if x.startswith(f"| {row['what']} |"))
        m = re.search(r"\| ([\d,.]+) (img/s|ms): \*\*(\d+\.\d\d)x\*\*", line)
        self.assertTrue(m, line)
        return line, m

    def assert_check_names(self, root, pages, row):
        r = self.headline_check(root)
        self.assertEqual(r.returncode, 1, r.stderr)
        first = r.stderr.splitlines()[0]
        self.assertEqual(first, f"headline: {', '.join(pages)}: the headline table differs from docs/headline.json "
                                "and its data; run scripts/headline.py")
        for page in pages:
            self.assertIn(f"{page}, row '{row['what']}'", r.stderr)

    def test_the_headline_check_fails_on_an_edited_cell_naming_it(self):
        # A cell of README.md's table that is not the data's: its convnets figure one higher in the last digit.
        root, row = self.headline_copy()
        line, m = self.gpu_cell(root, "README.md", row)
        figure = m.group(1)[:-1] + str((int(m.group(1)[-1]) + 1) % 10)
        self.replace_once(os.path.join(root, "README.md"), line, line.replace(m.group(0), m.group(0).replace(
            f"| {m.group(1)} ", f"| {figure} ")))
        self.assert_check_names(root, ["README.md"], row)

    def test_the_headline_check_fails_on_a_ratio_wrong_for_its_two_figures(self):
        # The page's ratio edited, the figures it is computed from (the run's summary) as they were.
        root, row = self.headline_copy()
        line, m = self.gpu_cell(root, "docs/PERFORMANCE.md", row)
        ratio = f"{float(m.group(3)) + 0.05:.2f}"
        self.replace_once(os.path.join(root, "docs", "PERFORMANCE.md"), line,
                          line.replace(f"**{m.group(3)}x**", f"**{ratio}x**", 1))
        self.assert_check_names(root, ["docs/PERFORMANCE.md"], row)
        # And the tables as they were, one of the two figures changed in the summary (its own ratio kept in step,
        # as bench/results_tables.py checks): both pages' ratio is now wrong for it.
        root, row = self.headline_copy()
        path = os.path.join(root, "bench", "results", row["gpu"]["run"], "summary.json")
        with open(path) as f:
            cells = json.load(f)
        theirs = row["gpu"]["theirs"][0]
        cell = next(c for c in cells if c["figure"] == theirs["figure"] and c["peer"] == theirs["peer"])
        cell["peer_value"] *= 1.25
        cell["ratio"] = cell["convnets"] / cell["peer_value"]
        with open(path, "w") as f:
            json.dump(cells, f)
        self.assert_check_names(root, ["README.md", "docs/PERFORMANCE.md"], row)


class FlagsDocumented(unittest.TestCase):
    def test_every_flag_of_every_help_page_is_in_the_manual(self):
        text = manual_text()
        missing, total = [], 0
        for words in HELP_PAGES:
            r = runner.run([BIN, *words, "--help"], capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 0, r.stderr)
            options = help_options(r.stdout)
            self.assertGreater(len(options), 1, f"no option lines read from `convnets {' '.join(words)} --help`")
            for names, help_text in options:
                for flag in names:
                    if flag == "--help":
                        continue
                    total += 1
                    if not documented(flag, text, refused=bool(REFUSED_HELP.search(help_text))):
                        missing.append(f"convnets {' '.join(words)} {flag}")
        self.assertGreater(total, 300)
        self.assertEqual(missing, [], "flags documented nowhere in README.md or docs/")

    def test_the_reader_finds_what_it_claims(self):
        self.assertEqual(help_flags("  -a,--model,--arch TEXT   x\n  --fp16   y\n      --not-an-option\n"),
                         [["--model", "--arch"], ["--fp16"]])
        self.assertTrue(documented("--no-flip", "use `--flip`"))
        self.assertTrue(documented("--flip", "`--no-flip` turns it off"))
        self.assertFalse(documented("--lr", "--lr-steps 30,60"))
        self.assertEqual(help_options("  --fp16   DLE's pure fp16: refused, use --amp\n  --max-image-pixels INT\n"
                                      "                 refuse images above N pixels\nSubcommands:\n  x   y\n"),
                         [(["--fp16"], "DLE's pure fp16: refused, use --amp"),
                          (["--max-image-pixels"], "INT refuse images above N pixels")])
        # A list of refusals documents only what convnets refuses itself; not a flag it names as the way instead.
        refusals = "DLE's flags run. Refused by name: `--gpu-affinity` other than none (no pinning), `--fp16` " \
                   "(pure fp16: use `--amp`). multiproc.py's `--nproc_per_node N` is the launcher's."
        self.assertFalse(documented("--gpu-affinity", refusals))
        self.assertFalse(documented("--amp", refusals))
        self.assertTrue(documented("--fp16", refusals, refused=True))
        self.assertTrue(documented("--nproc_per_node", refusals))
        self.assertFalse(documented("--trt", "- `--trt` and `--jit script` are refused."))
        self.assertTrue(documented("--trt", "- `--trt` (the SE blocks' TensorRT form) is refused, naming `export`."))
        # A refusal inside a statement of what is read is not a list of refusals; nor is a table cell beside one.
        self.assertTrue(documented("--cpu", "reads `--precision AMP|FP32` (any case; FP16 refused naming amp), "
                                            "`--cpu`, `--image-size`."))
        self.assertTrue(documented("--cpu", "| Refused by name: `--gpu` | `--cpu`: run on the CPU |"))
        self.assertFalse(documented("--cpu", "| Refused by name: `--gpu`, `--cpu` | other |"))


def readme_blocks():
    """(language, text) of each fenced block of README.md, in order."""
    return re.findall(r"^```(\w+)\n(.*?)^```", read(README), re.S | re.M)


# Shortened as test_seed_lines shortens the seeds' lines: later flags win.
# Whole epochs (a run cut by --prof writes no best.safetensors, which the next lines read).
SHORTER = {"train": ["--epochs", "1", "--max-train-images", "16", "-b", "8", "--image-size", "32",
                     "--max-val-images", "8", "--warmup", "0", "--workers", "1"],
           "eval": ["--image-size", "32", "--batch-size", "8"]}


@unittest.skipUnless(os.path.isdir(IMAGENET_LIKE), "CONVNETS_IMAGENET_LIKE: the JPEG folder fixture is not built")
class ReadmeCommands(unittest.TestCase):
    """The README's commands in order, in one folder, as a user runs them."""

    def setUp(self):
        self.cwd = tempfile.mkdtemp(prefix="convnets-readme-")
        os.makedirs(os.path.join(self.cwd, "data"))
        os.symlink(IMAGENET_LIKE, os.path.join(self.cwd, "data", "flowers"))
        os.symlink(IMAGENET_LIKE, os.path.join(self.cwd, "data", "imagenet"))
        first = sorted(os.listdir(os.path.join(IMAGENET_LIKE, "val")))[0]
        jpeg = sorted(os.listdir(os.path.join(IMAGENET_LIKE, "val", first)))[0]
        shutil.copy(os.path.join(IMAGENET_LIKE, "val", first, jpeg), os.path.join(self.cwd, "photo.jpg"))
        self.env = dict(os.environ, PATH=os.path.dirname(BIN) + os.pathsep + os.environ["PATH"],
                        PYTHONPATH=os.environ.get("CONVNETS_PYTHONPATH", ""))
        self.server = None

    def tearDown(self):
        if self.server and self.server.poll() is None:
            self.server.kill()
            self.server.wait()
        shutil.rmtree(self.cwd)

    def shell_lines(self, text):
        """(words, marker) per command line: the trailing `# ...` comment's GPU/download marker, if any."""
        for line in text.splitlines():
            if not line.strip():
                continue
            words = shlex.split(line, comments=True)
            comment = line[len(line.split("  #")[0]):] if "  #" in line else ""
            marker = "gpu" if re.search(r"#\s*GPU\b", comment) else "download" if "# download" in comment else None
            yield words, marker

    def run_convnets(self, words):
        args = words[1:]
        if args[0] in SHORTER:
            args = args + SHORTER[args[0]]
        return runner.run([BIN, *args], capture_output=True, text=True, timeout=600, cwd=self.cwd, env=self.env)

    def check_parses(self, words, marker):
        """A GPU line on the CPU: the flags read (train's --print-config resolves them); a download line: Python
        that compiles, or a command whose only failure is the file it would have downloaded."""
        if words[0] == "python":
            # Compiles; then runs with the download left out (random weights), for the lines after it.
            code = words[words.index("-c") + 1]
            compile(code, "<README>", "exec")
            self.assertIn("weights='DEFAULT'", code)
            r = subprocess.run([*runner.PYTHON, "-c", code.replace("weights='DEFAULT'", "weights=None")],
                               capture_output=True, text=True, timeout=300, cwd=self.cwd, env=self.env)
            self.assertEqual(r.returncode, 0, r.stderr)
            return
        self.assertEqual(words[:2], ["convnets", "train"], "only train lines may be marked # GPU")
        r = runner.run([BIN, *words[1:], "--print-config"], capture_output=True, text=True, timeout=120,
                       cwd=self.cwd, env=self.env)
        self.assertEqual(r.returncode, 0, f"{' '.join(words)}: {r.stderr}")

    def start_server(self, words):
        args = [w for w in words[1:]]
        for flag in ("--port", "--grpc-port"):
            if flag in args:
                args[args.index(flag) + 1] = "0"
        self.server = subprocess.Popen([BIN, *args, "--host", "127.0.0.1", "--metrics-port", "-1"], cwd=self.cwd,
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=self.env)
        for line in self.server.stdout:
            if " HTTP on " in line:
                return line.split(" HTTP on ")[1].split()[0].removeprefix("http://")
        self.fail("convnets serve did not start: " + self.server.stderr.read())

    def test_every_command_in_order(self):
        ran = checked = 0
        url = None
        for language, text in readme_blocks():
            if language == "python":
                if url:
                    text = text.replace("127.0.0.1:8000", url)
                ast.parse(text)
                r = subprocess.run([*runner.PYTHON, "-c", text], capture_output=True, text=True, timeout=600,
                                   cwd=self.cwd, env=self.env)
                self.assertEqual(r.returncode, 0, f"README's Python block:\n{text}\n{r.stderr}")
                self.assertTrue(r.stdout.strip(), "the block printed nothing")
                ran += 1
                continue
            self.assertEqual(language, "sh")
            for words, marker in self.shell_lines(text):
                with self.subTest(line=" ".join(words)):
                    if words[0].startswith("./scripts/"):
                        # The two commands: test.sh is this suite (.ci/run, checked in ReadmeShape); run.sh's
                        # training is test_train_cli's recipe, so here only that it is the script it says.
                        self.assertIn(words[0], ("./scripts/run.sh", "./scripts/test.sh"))
                        self.assertTrue(os.access(os.path.join(SOURCE, words[0]), os.X_OK))
                        continue
                    if marker:
                        self.check_parses(words, marker)
                        checked += 1
                        continue
                    self.assertEqual(words[0], "convnets", "a README command this test does not know how to run")
                    if words[1] == "serve":
                        url = self.start_server(words)
                        ran += 1
                        continue
                    r = self.run_convnets(words)
                    self.assertEqual(r.returncode, 0, f"{' '.join(words)}:\n{r.stdout[-2000:]}{r.stderr}")
                    ran += 1
                    if words[1] == "classify" and "--weights" in words:
                        self.assertIn("photo.jpg", r.stdout)
        self.assertIsNotNone(url, "the README's serve line did not run")
        self.server.send_signal(signal.SIGTERM)
        self.assertEqual(self.server.wait(timeout=60), 0)
        self.assertEqual((ran, checked), (15, 5))  # the README's commands, counted by hand


if __name__ == "__main__":
    unittest.main()
