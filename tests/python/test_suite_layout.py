"""The suite runs every test it has: each tests/python/test_*.py module, and each of its test classes, is run by some
CTest test of tests/CMakeLists.txt.

Some modules are split over several CTest tests by class (a part that needs both cores, a part under the accuracy
label), so a class added to such a module would otherwise run nowhere, silently.
"""
import ast
import os
import re
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
        # The parser itself: a module split by class shows its classes, the faults test its ARGS-named class.
        calls = {name: named for name, _, named in ctest_calls()}
        self.assertEqual(calls["engines_accuracy"], ["EngineAccuracy"])
        self.assertEqual(calls["faults_disk_full"], ["DiskFullWhileSaving"])
        self.assertIsNone(calls["cli"])


if __name__ == "__main__":
    unittest.main()
