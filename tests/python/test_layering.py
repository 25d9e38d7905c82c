"""The floors of src/ (docs/ARCHITECTURE.md): a folder includes only folders on lower floors, so the include graph
between folders has no cycle and nothing leans on a floor above it. Inference (runtime/, deploy/, quant/, export/)
stands below training (train/): a server or an exporter built on it never drags in the training configuration.

The rules are FLOORS below; the test reads every `#include "folder/..."` of src/ and names each one that breaks them.
"""
import os
import re
import unittest

SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "src")

# Folder -> floor. A folder may include its own files and those of folders on lower floors.
FLOORS = {
    "core": 0,                                   # errors, JSON, compatibility, CPU features: depends on nothing
    "io": 1, "codec": 1, "kernels": 1, "report": 1,
    "kserve": 1,                                 # the KServe v2 protocol's bodies, both directions: server and client
    "data": 2, "models": 2,
    "runtime": 3,                                # what training and inference share
    "quant": 4, "distributed": 4,
    "export": 5,                                 # ONNX export of float and quantized graphs
    "deploy": 6,                                 # inference engines, checkpoint and ONNX models, export
    "bench": 7,                                  # bench train is handed the training step (train/bench_step.h)
    "serve": 7,                                  # the inference server, on deploy/'s engines
    "train": 8,
    "cli": 9, "python": 9,
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([a-z_]+)/[^"]+"', re.M)


def includes():
    """(file relative to src/, its folder, the folder it includes) for every folder-qualified include."""
    for folder in sorted(os.listdir(SRC)):
        top = os.path.join(SRC, folder)
        if not os.path.isdir(top):
            continue
        for dirpath, _, files in os.walk(top):
            for name in sorted(files):
                if not name.endswith((".h", ".cpp", ".cu", ".cuh")):
                    continue
                path = os.path.join(dirpath, name)
                with open(path, encoding="utf-8") as f:
                    for target in INCLUDE.findall(f.read()):
                        yield os.path.relpath(path, SRC), folder, target


def violations(found):
    """The includes of `found` ((path, folder, target) triples) that reach a folder on the same floor or above."""
    return [f"{path} includes {target}/ (floor {FLOORS[target]}; {folder}/ is on floor {FLOORS[folder]})"
            for path, folder, target in found
            if target != folder and target in FLOORS and folder in FLOORS and FLOORS[target] >= FLOORS[folder]]


class Floors(unittest.TestCase):
    def test_every_folder_of_src_has_a_floor(self):
        folders = {d for d in os.listdir(SRC) if os.path.isdir(os.path.join(SRC, d))}
        self.assertEqual(folders - set(FLOORS), set(), "a new folder of src/: give it a floor here and in "
                                                         "docs/ARCHITECTURE.md")
        self.assertEqual(set(FLOORS) - folders, set(), "a floor for a folder src/ no longer has")

    def test_no_folder_includes_one_on_its_floor_or_above(self):
        self.assertEqual(violations(includes()), [])

    def test_includes_name_folders_of_src(self):
        # A folder-qualified include that is not a folder of src/ is a typo or a new folder without a floor.
        unknown = [f"{path} includes {target}/" for path, _, target in includes() if target not in FLOORS]
        self.assertEqual(unknown, [])

    def test_the_check_reports_what_the_runtime_floor_removed(self):
        # Before the runtime floor, deploy/ read train/'s runtime and checkpoints, and distributed/ train/'s step.
        before = [("deploy/inference.h", "deploy", "train"), ("distributed/grad_sync.h", "distributed", "train"),
                  ("quant/eager.h", "quant", "train"), ("train/run.cpp", "train", "quant")]
        self.assertEqual(len(violations(before)), 3)
        self.assertIn("deploy/inference.h includes train/ (floor 8; deploy/ is on floor 6)", violations(before))
        # Before bench train was handed its step, bench/ included train/'s; that is now refused too.
        self.assertEqual(violations([("bench/model_bench.cpp", "bench", "train")]),
                         ["bench/model_bench.cpp includes train/ (floor 8; bench/ is on floor 7)"])
        # Same-floor includes between two folders are refused too: a floor holds folders that do not need each other.
        self.assertEqual(len(violations([("quant/x.h", "quant", "distributed")])), 1)


if __name__ == "__main__":
    unittest.main()
