"""README.md and docs/ against what they describe (issue 61).

The README is a landing page: short, its first screen says what convnets is, the two commands and where to go,
and it holds no commit hashes or dated history (docs/ does). Its headline table is the one docs/PERFORMANCE.md
opens with, both rendered from docs/headline.json and the runs' data by scripts/headline.py. Every flag that a
command's `--help` lists is documented in README.md or a page of docs/ (PERFORMANCE.md is measurements, not a
manual). ReadmeCommands runs every command the README shows, in order, as a user would after cloning, on the
ImageNet-like JPEG fixture; a line marked `# GPU` or `# download` is instead checked to parse.
"""
import ast
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


def help_flags(text):
    """Each option line's long names, from one `--help` page."""
    out = []
    for line in text.splitlines():
        m = OPTION_LINE.match(line)
        if m:
            out.append([n for n in m.group(1).split(",") if n.startswith("--")])
    return out


def documented(flag, text):
    names = {flag, "--no-" + flag[2:]} | ({"--" + flag[5:]} if flag.startswith("--no-") else set())
    return any(re.search(re.escape(n) + r"(?![\w-])", text) for n in names)


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


class FlagsDocumented(unittest.TestCase):
    def test_every_flag_of_every_help_page_is_in_the_manual(self):
        text = manual_text()
        missing, total = [], 0
        for words in HELP_PAGES:
            r = runner.run([BIN, *words, "--help"], capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 0, r.stderr)
            options = help_flags(r.stdout)
            self.assertGreater(len(options), 1, f"no option lines read from `convnets {' '.join(words)} --help`")
            for names in options:
                for flag in names:
                    if flag == "--help":
                        continue
                    total += 1
                    if not documented(flag, text):
                        missing.append(f"convnets {' '.join(words)} {flag}")
        self.assertGreater(total, 300)
        self.assertEqual(missing, [], "flags documented nowhere in README.md or docs/")

    def test_the_reader_finds_what_it_claims(self):
        self.assertEqual(help_flags("  -a,--model,--arch TEXT   x\n  --fp16   y\n      --not-an-option\n"),
                         [["--model", "--arch"], ["--fp16"]])
        self.assertTrue(documented("--no-flip", "use `--flip`"))
        self.assertTrue(documented("--flip", "`--no-flip` turns it off"))
        self.assertFalse(documented("--lr", "--lr-steps 30,60"))


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
