"""The suite runs every test it has: each tests/python/test_*.py module, and each of its test classes, is run by some
CTest test of tests/CMakeLists.txt.

Some modules are split over several CTest tests by class (a part that needs both cores, a part under the accuracy
label), so a class added to such a module would otherwise run nowhere, silently.
"""
import ast
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
CMAKE = os.path.join(HERE, "..", "CMakeLists.txt")


def ctest_calls():
    """(CTest name, module, the classes it names or None for the whole module) per convnets_python_test call."""
    with open(CMAKE) as f:
        text = re.sub(r"#[^\n]*", "", f.read())
    calls = []
    for m in re.finditer(r"convnets_python_test\(([^)]*)\)", text):
        words = m.group(1).split()
        name, module, rest = words[0], words[1], words[2:]
        keywords = {"LABELS", "PROCESSORS", "TIMEOUT", "SKIP_RETURN_CODE", "FIXTURES", "ARGS", "TESTS"}
        sections, key = {}, None
        for w in rest:
            if w in keywords:
                key = w
                sections[key] = []
            elif key:
                sections[key].append(w)
        named = sections.get("TESTS") or [w for w in sections.get("ARGS", []) if re.match(r"^[A-Z]\w*(\.\w+)?$", w)]
        calls.append((name, module, [n.split(".")[0] for n in named] if named else None))
    return calls


def test_classes(path):
    """The classes of a module that define test methods themselves."""
    with open(path) as f:
        tree = ast.parse(f.read())
    return {node.name for node in tree.body if isinstance(node, ast.ClassDef) and any(
        isinstance(item, ast.FunctionDef) and item.name.startswith("test_") for item in node.body)}


class SuiteLayout(unittest.TestCase):
    def test_every_module_and_class_is_run_by_ctest(self):
        calls = ctest_calls()
        self.assertGreater(len(calls), 20, "the convnets_python_test calls were not found in " + CMAKE)
        modules = sorted(f[:-3] for f in os.listdir(HERE) if f.startswith("test_") and f.endswith(".py"))
        for module in modules:
            with self.subTest(module=module):
                mine = [c for c in calls if c[1] == module]
                self.assertTrue(mine, module + ".py is run by no CTest test")
                classes = test_classes(os.path.join(HERE, module + ".py"))
                if any(named is None for _, _, named in mine):
                    continue  # the whole module runs somewhere
                covered = {cls for _, _, named in mine for cls in named}
                self.assertEqual(classes - covered, set(), module + ": test classes no CTest test names")
                self.assertEqual(covered - classes, set(), module + ": CTest names classes the module lacks")

    def test_the_check_reads_the_split_modules(self):
        # The parser itself: a module split by class shows its classes, as the disk-full test names its one.
        calls = {name: named for name, _, named in ctest_calls()}
        self.assertEqual(calls["engines_accuracy"], ["EngineAccuracy"])
        self.assertEqual(calls["faults_disk_full"], ["DiskFullWhileSaving"])
        self.assertIsNone(calls["cli"])


class SkipsReadAsSkips(unittest.TestCase):
    """ctest_unittest.py, which runs every module above: its exit status is all CTest sees."""

    def status(self, body):
        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(tmp, "probe_module.py"), "w") as f:
                f.write("import unittest\n\n\n" + textwrap.dedent(body))
            r = subprocess.run([sys.executable, os.path.join(HERE, "ctest_unittest.py"), "probe_module"],
                               capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": tmp})
            return r.returncode, r.stderr

    def test_a_skipped_class_is_a_skip_a_failure_a_failure(self):
        passing = "class A(unittest.TestCase):\n    def test_a(self):\n        pass\n"
        skipped = ("@unittest.skipUnless(False, 'no ../shared')\nclass B(unittest.TestCase):\n"
                   "    def test_b(self):\n        pass\n")
        failing = "class C(unittest.TestCase):\n    def test_c(self):\n        self.fail('no')\n"
        self.assertEqual(self.status(passing)[0], 0)
        code, err = self.status(passing + skipped)
        self.assertEqual(code, 77, err)
        self.assertIn("probe_module.B.test_b: no ../shared", err)
        self.assertEqual(self.status(passing + skipped + failing)[0], 1)
        # A skip raised in setUpClass (a fixture that cannot be made) runs no test at all: still a skip.
        code, err = self.status("class D(unittest.TestCase):\n    @classmethod\n    def setUpClass(cls):\n"
                                "        raise unittest.SkipTest('no tmpfs')\n\n    def test_d(self):\n        pass\n")
        self.assertEqual(code, 77, err)
        self.assertEqual(self.status("X = 1\n")[0], 1)  # nothing ran: not a pass either

    def test_every_unittest_call_counts_skips(self):
        with open(CMAKE) as f:
            text = f.read()
        start = text.index("function(convnets_python_test")
        function = text[start:text.index("endfunction()", start)]
        commands = re.findall(r"set\(command [^)]*\)", function)
        self.assertEqual(len(commands), 3, function)
        # Every command but the ARGS one (a script's own main) goes through ctest_unittest.py.
        self.assertEqual(sum("ctest_unittest.py" in c for c in commands), 2, commands)
        self.assertEqual(function.count("set(T_SKIP_RETURN_CODE 77)"), 2, function)


if __name__ == "__main__":
    unittest.main()
