"""Every command line the seeds print (../shared/seeds: DLE's ResNet-50 and GPUNet READMEs) through convnets, as a
user would type it: `python ./main.py` as `convnets train`, `multiproc.py` and `train.sh` as its launcher,
`classify.py` as `convnets classify`, `validate.py` (timm's, in the GPUNet README) as `convnets eval`.

DeepLearningExamples' README has changed since the seed was taken: its current lines (CURRENT_LINES, quoted from
the upstream file named there) use classify.py's and main.py's --pretrained-from-file, and launch.py's presets
(--model --precision --mode --platform) in place of the seed's benchmark lines; they go through the same check.
Where ../shared/reference/dle holds copies of that README and of the configs.yml launch.py reads (byte for byte, its
SOURCE naming the commit and each file's git blob hash), the lines are checked against the README and the presets
against configs.yml; without them those checks skip, by name.

Each line either runs, or is refused with one line naming what convnets offers instead. The lines are data below,
as printed; only the placeholders are filled (a small JPEG folder for ImageNet, checkpoints made from the
reference key lists), and the data and epochs shortened (SHORTER). The AMP and TF32 lines need a CUDA GPU: on the
CPU they are refused naming --precision fp32; on a CUDA machine they would run, and the counts this module expects
there are written out beside the CPU's, but no run has checked them: scripts/gpu.sh does not run the module, since
../shared does not travel to the GPU machine.
"""
import collections
import hashlib
import json
import os
import re
import shutil
import tempfile
import unittest

import torch
import yaml

import fixtures  # the suite's shared tables (tests/python/fixtures.py)
import runner

BIN = os.environ["CONVNETS_BIN"]
SHARED = os.environ.get("CONVNETS_SHARED_DIR", "")
SEEDS = os.path.join(SHARED, "seeds")
REFERENCE = os.path.join(SHARED, "reference")
IMAGENET_LIKE = os.environ.get("CONVNETS_IMAGENET_LIKE", "")

RESNET_README, GPUNET_README = "001_455c66f038af6f9b.txt", "002_600344c3d2637515.txt"
# Copies of DLE's files, byte for byte, with a SOURCE list (repository, commit, each file's path and git blob hash):
# fetched data lives only in the steering repository's shared/, never in this one.
DLE_COPIES = os.path.join(REFERENCE, "dle")


def require_dle_copies():
    if not os.path.isfile(os.path.join(DLE_COPIES, "SOURCE")):
        raise unittest.SkipTest(DLE_COPIES + " holds no copies of DLE's README and configs.yml (fetched files live "
                                "in the steering repository's shared/ only): the checks against DLE's own text wait")

# (seed, the line as the seed prints it). `A|B|C` is one line per choice, as the README means it.
LINES = [
    (RESNET_README, "python ./main.py --arch resnet50 --evaluate --epochs 1 --resume <path to checkpoint> "
                    "-b <batch size> <path to imagenet>"),
    (RESNET_README, "python classify.py --arch resnet50 -c fanin --weights <path to weights from previous step> "
                    "--precision AMP|FP16|FP32 --image <path to JPEG image>"),
    (RESNET_README, "python ./main.py --arch resnet50 -c fanin --label-smoothing 0.1 <path to imagenet>"),
    (RESNET_README, "python ./main.py --arch resnet50 -c fanin --label-smoothing 0.1 --amp --static-loss-scale 256 "
                    "<path to imagenet>"),
    (RESNET_README, "python ./multiproc.py --nproc_per_node 8 ./main.py --arch resnet50 -c fanin --label-smoothing "
                    "0.1 <path to imagenet>"),
    (RESNET_README, "python ./multiproc.py --nproc_per_node 8 ./main.py --arch resnet50 -c fanin --label-smoothing "
                    "0.1 --amp --static-loss-scale 256 <path to imagenet>"),
    (RESNET_README, "python ./main.py -h"),
    (RESNET_README, "python ./main.py --arch resnet50 --training-only -p 1 --raport-file benchmark.json --epochs 1 "
                    "--prof 100 <path to imagenet>"),
    (RESNET_README, "python ./main.py --arch resnet50 --training-only -p 1 --raport-file benchmark.json --epochs 1 "
                    "--prof 100 --fp16 --static-loss-scale 256 <path to imagenet>"),
    (RESNET_README, "python ./main.py --arch resnet50 --training-only -p 1 --raport-file benchmark.json --epochs 1 "
                    "--prof 100 --amp --static-loss-scale 256 <path to imagenet>"),
    (RESNET_README, "python ./multiproc.py --nproc_per_node 8 ./main.py --arch resnet50 --training-only -p 1 "
                    "--raport-file benchmark.json --epochs 1 --prof 100 <path to imagenet>"),
    (RESNET_README, "python ./multiproc.py --nproc_per_node 8 ./main.py --arch resnet50 --training-only -p 1 "
                    "--raport-file benchmark.json --fp16 --static-loss-scale 256 --epochs 1 --prof 100 "
                    "<path to imagenet>"),
    (RESNET_README, "python ./multiproc.py --nproc_per_node 8 ./main.py --arch resnet50 --training-only -p 1 "
                    "--raport-file benchmark.json --amp --static-loss-scale 256 --epochs 1 --prof 100 "
                    "<path to imagenet>"),
    (RESNET_README, "python ./main.py --arch resnet50 -p 1 --raport-file benchmark.json --epochs 1 --prof 100 "
                    "--evaluate <path to imagenet>"),
    (RESNET_README, "python ./main.py --arch resnet50 -p 1 --raport-file benchmark.json --epochs 1 --prof 100 "
                    "--evaluate --fp16 <path to imagenet>"),
    (RESNET_README, "python ./main.py --arch resnet50 -p 1 --raport-file benchmark.json --epochs 1 --prof 100 "
                    "--evaluate --amp <path to imagenet>"),
    # The GPUNet README's validate.py, its flags one per line there, and its help lines.
    (GPUNET_README, "python validate.py /path/to/imagenet/val --model gpunet_0 -b 200 -j 8 --img-size 320 "
                    "--num-classes 1000 --checkpoint ./configs/batch1/GV100/0.65ms.pth.tar"),
    (GPUNET_README, "python train.py -h"),
    (GPUNET_README, "python validate.py -h"),
]

# DeepLearningExamples' PyTorch/Classification/ConvNets/resnet50v1.5/README.md at 729963dd (2024-04-04), the lines
# that differ from the seed's (the -c fanin training lines and the --resume one are unchanged). Line 519 repeats 512.
# DleCopies checks each is in the README's copy in ../shared/reference/dle, where one is kept.
CURRENT_README = "NVIDIA/DeepLearningExamples@729963dd resnet50v1.5/README.md"
CURRENT_LINES = [
    (CURRENT_README, "python ./main.py --arch resnet50 --evaluate --epochs 1 --pretrained-from-file "
                     "nvidia_resnet50_200821.pth.tar -b <batch size> <path to imagenet>"),
    (CURRENT_README, "python classify.py --arch resnet50 --pretrained-from-file nvidia_resnet50_200821.pth.tar "
                     "--precision AMP|FP32 --image <path to JPEG image>"),
    (CURRENT_README, "python main.py -h"),
    (CURRENT_README, "python classify.py --arch resnet50 --pretrained-from-file <path to weights from previous step> "
                     "--precision AMP|FP32 --image <path to JPEG image>"),
    (CURRENT_README, "python ./main.py --arch resnet50 --evaluate --epochs 1 --pretrained-from-file "
                     "<path to pretrained weights> -b <batch size> <path to imagenet>"),
    (CURRENT_README, "python classify.py --arch resnet50 --weights nvidia_resnet50_200821.pth.tar "
                     "--precision AMP|FP32 --image <path to JPEG image>"),
    (CURRENT_README, "python ./launch.py --model resnet50 --precision FP32 --mode benchmark_training --platform DGX1V "
                     "<path to imagenet> --raport-file benchmark.json --epochs 1 --prof 100"),
    (CURRENT_README, "python ./launch.py --model resnet50 --precision TF32 --mode benchmark_training "
                     "--platform DGXA100 <path to imagenet> --raport-file benchmark.json --epochs 1 --prof 100"),
    (CURRENT_README, "python ./launch.py --model resnet50 --precision AMP --mode benchmark_training "
                     "--platform <DGX1V|DGXA100> <path to imagenet> --raport-file benchmark.json --epochs 1 --prof 100"),
    (CURRENT_README, "python ./multiproc.py --nproc_per_node 8 ./launch.py --model resnet50 --precision TF32 "
                     "--mode benchmark_training --platform DGXA100 <path to imagenet> --raport-file benchmark.json "
                     "--epochs 1 --prof 100"),
    (CURRENT_README, "python ./multiproc.py --nproc_per_node 8 ./launch.py --model resnet50 --precision AMP "
                     "--mode benchmark_training --platform <DGX1V|DGXA100> <path to imagenet> "
                     "--raport-file benchmark.json --epochs 1 --prof 100"),
    (CURRENT_README, "python ./launch.py --model resnet50 --precision FP32 --mode benchmark_inference "
                     "--platform DGX1V <path to imagenet> --raport-file benchmark.json --epochs 1 --prof 100"),
    (CURRENT_README, "python ./launch.py --model resnet50 --precision TF32 --mode benchmark_inference "
                     "--platform DGXA100 <path to imagenet> --raport-file benchmark.json --epochs 1 --prof 100"),
    (CURRENT_README, "python ./launch.py --model resnet50 --precision AMP --mode benchmark_inference "
                     "--platform <DGX1V|DGXA100> <path to imagenet> --raport-file benchmark.json --epochs 1 --prof 100"),
]

# A refusal: what its error line names, and the convnets equivalent it (or its hint) gives.
FP16_REFUSED = ("error: --fp16: convnets does not train in pure fp16", "use --amp")
FP16_PRECISION_REFUSED = ("error: --precision: FP16 (pure fp16 weights) is not offered", "--precision amp runs fp16")
AMP_ON_CPU = ("error: --precision amp needs a CUDA GPU, and this run is on the CPU", "use --precision fp32 on the CPU")
TF32_ON_CPU = ("error: --precision tf32 needs a CUDA GPU, and this run is on the CPU", "use --precision fp32 on the CPU")
OTHER_PLATFORM = ("error: --platform DGX1V: convnets carries DLE's DGXA100 configurations only",
                  "use --platform DGXA100, or --recipe resnet50-250ep")

# Shortened, as the issue allows: one or two steps of small images, a batch that two cores run.
# The optimizer batch too: --platform DGXA100's 8 x 256 is more than the folder's 320 training images.
SHORTER = {"--epochs": "1", "--prof": "2", "-b": "8", "--image-size": "32", "--optimizer-batch-size": "0"}


# launch.py's configuration fields (main.py's argument names, as configs.yml writes them) -> the field of convnets'
# --print-config, and how configs.yml's value reads there. The values come from configs.yml; these are only names.
LAUNCH_FIELDS = {
    "epochs": ("epochs", int), "print_freq": ("print_freq", int), "prof": ("prof", int),
    "training_only": ("training_only", bool), "evaluate": ("evaluate", bool), "save_checkpoints": ("checkpoints", bool),
    # main.py's --data-backend: synthetic is convnets' DATA `synthetic`; a loader reads the folder given.
    "data_backend": ("data", lambda v: "synthetic" if v == "synthetic" else IMAGENET_LIKE),
    "batch_size": ("batch_size", int), "optimizer_batch_size": ("optimizer_batch_size", int),
    "mixup": ("mixup", float), "label_smoothing": ("label_smoothing", float), "momentum": ("momentum", float),
    "weight_decay": ("weight_decay", float), "lr_schedule": ("lr_schedule", str),
}


def dle_copies():
    """(commit, {copy: (its path in DeepLearningExamples, git blob hash)}) from DLE_COPIES/SOURCE."""
    commit, files = None, {}
    with open(os.path.join(DLE_COPIES, "SOURCE")) as f:
        for line in f:
            words = line.split()
            if not words or words[0].startswith("#"):
                continue
            if words[0] == "repository":
                assert words[1:] == ["NVIDIA/DeepLearningExamples"], words
            elif words[0] == "commit":
                commit = words[1]
            else:
                files[words[0]] = (words[1], words[2])
    return commit, files


def launch_config(model, platform, precision, mode):
    """What DLE's launch.py sets for a line, from the copy of the configs.yml it reads, merged as launch.py merges
    it (later blocks win): {**precision, **platform, **models[model][platform][precision], **mode}."""
    with open(os.path.join(DLE_COPIES, "configs.yml")) as f:
        config = yaml.safe_load(f)
    return {**config["precision"][precision], **config["platform"][platform],
            **config["models"][model][platform][precision], **config["mode"][mode]}


# Flags of train.params lines read apart from fixtures.TIMM_TRAIN_FLAGS: bare ones, the ignored dropouts, the switch.
TIMM_OTHER = {"--model-ema", "--amp", "--enable-distill"} | fixtures.TIMM_IGNORED


def timm_flags(words):
    """{flag: value, or None for a bare flag} of a train.py command line."""
    out, i = {}, 0
    while i < len(words):
        assert words[i].startswith("-"), words[i:]
        bare = i + 1 == len(words) or (words[i + 1].startswith("--") or words[i + 1] == "-b")
        out[words[i]] = None if bare else words[i + 1]
        i += 1 if bare else 2
    return out


def launcher(words):
    """The convnets words for the script a line starts with, and the rest of the line."""
    if words[:2] == ["python", "./multiproc.py"]:
        assert words[2] == "--nproc_per_node" and words[4] in ("./main.py", "./launch.py"), words
        # A process per GPU there; two CPU processes here.
        return ["train", "--nproc_per_node", "2"], words[5:]
    script = {"./main.py": "train", "main.py": "train", "train.py": "train", "classify.py": "classify",
              "validate.py": "eval", "./launch.py": "train"}
    assert words[0] == "python" and words[1] in script, words
    return [script[words[1]]], words[2:]


def expand(line):
    """One line per choice of an `A|B|C` (or `<A|B>`) value."""
    m = re.search(r"<(\w+(?:\|\w+)+)>|(\S+\|\S+)", line)
    if not m:
        return [line]
    return [line[:m.start()] + choice + line[m.end():] for choice in (m.group(1) or m.group(2)).split("|")]


def shortened(args):
    out = list(args)
    for flag, value in SHORTER.items():
        if flag in out:
            out[out.index(flag) + 1] = value
        else:
            out += [flag, value]
    return out


def expectation(words):
    """None where the line runs; else what its refusal must say."""
    if "--fp16" in words:
        return FP16_REFUSED
    if "FP16" in words:
        return FP16_PRECISION_REFUSED
    if "DGX1V" in words:  # launch.py's --platform: checked before the device
        return OTHER_PLATFORM
    if ("--amp" in words or "AMP" in words) and not torch.cuda.is_available():
        return AMP_ON_CPU
    if "TF32" in words and not torch.cuda.is_available():
        return TF32_ON_CPU
    return None


def random_state_dict(keys_file, classes=None):
    """A state dict with the reference's names and shapes (../shared/reference/models); `classes` resizes the
    classifier (the last two entries) to a small folder's class count."""
    with open(os.path.join(REFERENCE, "models", keys_file)) as f:
        entries = json.load(f)["state_dict"]
    g = torch.Generator().manual_seed(0)
    out = collections.OrderedDict()
    for i, (name, shape) in enumerate(entries):
        if classes and i >= len(entries) - 2:
            shape = [classes] + shape[1:]
        if name.endswith("num_batches_tracked"):
            out[name] = torch.tensor(0)
        elif name.endswith("running_var"):
            out[name] = torch.ones(shape)
        else:
            out[name] = 0.02 * torch.randn(shape, generator=g)
    return out


def dle_checkpoint(weights):
    """DLE main.py's checkpoint.pth.tar: DDP names, SGD over its two param groups (nothing stepped yet)."""
    params = collections.OrderedDict((k, torch.nn.Parameter(v)) for k, v in weights.items()
                                     if not k.endswith(("running_mean", "running_var", "num_batches_tracked")))
    sgd = torch.optim.SGD([{"params": [p for k, p in params.items() if "bn" in k], "weight_decay": 0},
                           {"params": [p for k, p in params.items() if "bn" not in k], "weight_decay": 3.05e-5}],
                          lr=0.256, momentum=0.875)
    return {"epoch": 90, "best_prec1": 76.9, "optimizer": sgd.state_dict(),
            "state_dict": collections.OrderedDict(("module." + k, v) for k, v in weights.items())}


@unittest.skipUnless(os.path.isdir(SEEDS) and os.path.isdir(REFERENCE),
                     "../shared (seeds, reference key lists) is not beside the clone (CI has it)")
@unittest.skipUnless(os.path.isdir(IMAGENET_LIKE), "CONVNETS_IMAGENET_LIKE: the JPEG folder fixture is not built")
class SeedCommandLines(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="convnets-seeds-")
        classes = sorted(os.listdir(os.path.join(IMAGENET_LIKE, "val")))
        resnet = random_state_dict("dle-resnet50.keys.json", classes=len(classes))
        cls.checkpoint = os.path.join(cls.tmp, "checkpoint.pth.tar")
        torch.save(dle_checkpoint(resnet), cls.checkpoint)
        cls.weights = os.path.join(cls.tmp, "nvidia_resnet50.pth")  # checkpoint2model.py's output: the state dict
        torch.save(resnet, cls.weights)
        cls.gpunet = os.path.join(cls.tmp, "0.65ms.pth.tar")
        torch.save({"state_dict": random_state_dict("gpunet-0.keys.json")}, cls.gpunet)
        # validate.py's val folder, shortened to an image per class.
        cls.val = os.path.join(cls.tmp, "val")
        for c in classes:
            os.makedirs(os.path.join(cls.val, c))
            first = sorted(os.listdir(os.path.join(IMAGENET_LIKE, "val", c)))[0]
            os.symlink(os.path.join(IMAGENET_LIKE, "val", c, first), os.path.join(cls.val, c, first))
        cls.jpeg = os.path.join(cls.val, classes[0], os.listdir(os.path.join(cls.val, classes[0]))[0])

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp)

    def placeholders(self):
        return {"<path to imagenet>": IMAGENET_LIKE, "<path to checkpoint>": self.checkpoint, "<batch size>": "8",
                "<path to weights from previous step>": self.weights, "<path to JPEG image>": self.jpeg,
                "<path to pretrained weights>": self.weights,
                "/path/to/imagenet/val": self.val, "./configs/batch1/GV100/0.65ms.pth.tar": self.gpunet}

    def run_line(self, words, cwd):
        command, rest = launcher(words)
        args = command + rest
        if command[0] == "train" and "-h" not in rest:
            args = shortened(args)
        return runner.run([BIN, *args], capture_output=True, text=True, timeout=600, cwd=cwd), args

    def test_the_lines_are_the_seeds_own(self):
        # Each line, with its A|B|C, is in its seed as printed (the ResNet README runs some together on one line).
        for seed, line in LINES:
            with open(os.path.join(SEEDS, seed), encoding="utf-8") as f:
                text = " ".join(f.read().split())
            # The GPUNet README prints a line's flags one per line, each with a comment: each flag as printed.
            parts = re.split(r" (?=-)", line) if seed == GPUNET_README else [line]
            for part in parts:
                with self.subTest(line=line, part=part):
                    self.assertIn(part, text)

    def test_every_line_runs_or_is_refused_by_name(self):
        ran, refused = self.check_lines(LINES)
        # 21 lines once A|B|C is expanded: 3 --fp16 and 1 FP16 refused everywhere, 6 AMP ones on the CPU only.
        self.assertEqual((ran, refused), (17, 4) if torch.cuda.is_available() else (11, 10))

    def test_todays_dle_lines_run_or_are_refused_by_name(self):
        ran, refused = self.check_lines(CURRENT_LINES)
        # 20 lines expanded: launch.py's 5 DGX1V ones refused everywhere; on the CPU also 3 TF32 and 6 AMP ones.
        self.assertEqual((ran, refused), (15, 5) if torch.cuda.is_available() else (6, 14))

    def test_launch_py_presets(self):
        # What a DGXA100 line resolves to (the model's 250-epoch recipe, the mode's fields under the flags given),
        # and a benchmark_training line run in fp32 on the CPU: its report, and no checkpoint (the mode's).
        base = ["train", "--model", "resnet50", "--platform", "DGXA100", "--precision", "FP32", IMAGENET_LIKE]
        expected = {
            "benchmark_training": {"epochs": 3, "training_only": True, "checkpoints": False, "print_freq": 1},
            "benchmark_training_short": {"epochs": 1, "prof": 100, "data": "synthetic", "checkpoints": False},
            "benchmark_inference": {"epochs": 1, "evaluate": True, "checkpoints": False, "print_freq": 1},
            "evaluate": {"epochs": 1, "evaluate": True, "checkpoints": False, "print_freq": 20},
            "convergence": {"epochs": 250, "checkpoints": True, "print_freq": 20},
        }
        for mode, fields in expected.items():
            with self.subTest(mode=mode):
                r = runner.run([BIN, *base, "--mode", mode, "--print-config"], capture_output=True, text=True,
                               timeout=120)
                self.assertEqual(r.returncode, 0, r.stderr)
                config = json.loads(r.stdout)
                self.assertEqual({k: config[k] for k in fields}, fields)
                self.assertEqual((config["precision"], config["mixup"], config["batch_size"]), ("fp32", 0.2, 256))
                # A DGX A100's 8 GPUs of 256: DLE accumulates to it on fewer; NCHW outside AMP, as main.py's.
                self.assertEqual((config["optimizer_batch_size"], config["memory_format"]), (2048, "nchw"))
        r = runner.run([BIN, *base, "--mode", "benchmark_training", "--epochs", "7", "--print-config"],
                       capture_output=True, text=True, timeout=120)
        self.assertEqual(json.loads(r.stdout)["epochs"], 7)  # a flag given wins over the mode
        cwd = tempfile.mkdtemp(dir=self.tmp)
        args = shortened(base + ["--mode", "benchmark_training", "--raport-file", "benchmark.json"])
        r = runner.run([BIN, *args], capture_output=True, text=True, timeout=600, cwd=cwd)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.check_what_ran(args, r, cwd)
        written = [f for _, _, files in os.walk(cwd) for f in files]
        self.assertIn("benchmark.json", written)
        self.assertEqual([f for f in written if f.endswith(".safetensors")], [], written)

    def check_lines(self, lines):
        """(ran, refused) over every variant of `lines`."""
        ran = refused = 0
        for seed, printed in lines:
            for line in expand(printed):
                for placeholder, value in self.placeholders().items():
                    line = line.replace(placeholder, value)
                words = line.split()
                cwd = tempfile.mkdtemp(dir=self.tmp)
                os.symlink(self.weights, os.path.join(cwd, "nvidia_resnet50_200821.pth.tar"))  # NGC's, downloaded
                with self.subTest(line=printed, variant=line):
                    r, args = self.run_line(words, cwd)
                    refusal = expectation(words)
                    if refusal is None:
                        self.assertEqual(r.returncode, 0, f"convnets {' '.join(args)}:\n{r.stdout[-2000:]}{r.stderr}")
                        ran += 1
                        self.check_what_ran(args, r, cwd)
                    else:
                        self.assertNotEqual(r.returncode, 0, f"convnets {' '.join(args)} ran: {r.stdout[-1000:]}")
                        names, instead = refusal
                        errors = [x for x in r.stderr.splitlines() if "error" in x]
                        self.assertTrue(errors and names in errors[0], f"convnets {' '.join(args)}:\n{r.stderr}")
                        self.assertIn(instead, r.stderr)
                        refused += 1
        return ran, refused

    def check_what_ran(self, args, r, cwd):
        """What each kind of line must have done, beyond exiting 0."""
        if "-h" in args:
            self.assertIn("Usage:", r.stdout)
        elif args[0] == "classify":
            self.assertIn(self.jpeg, r.stdout)
            self.assertEqual(r.stdout.count("%"), 5)  # DLE's top-5
        elif args[0] == "eval":
            self.assertRegex(r.stdout, r"top-1 +\d+\.\d+%")
            self.assertIn("10 images", r.stdout)
        elif "--resume" in args:
            self.assertIn(f"resume: {self.checkpoint} is DLE's checkpoint after epoch 90 (best top-1 76.9)", r.stdout)
            self.assertIn("val 2/2", r.stdout)
        elif "--pretrained-from-file" in args:
            path = args[args.index("--pretrained-from-file") + 1]
            self.assertIn(f"fine-tune: weights from {path}\n", r.stdout)  # all of them: the same class count
            self.assertIn("val 2/2", r.stdout)
        elif "--raport-file" in args:
            workspace = [os.path.join(root, "benchmark.json") for root, _, files in os.walk(cwd)
                         if "benchmark.json" in files]
            self.assertEqual(len(workspace), 1, r.stdout)
            with open(workspace[0]) as f:
                records = [json.loads(x[5:]) for x in f]
            key = "val.total_ips" if "--evaluate" in args or "benchmark_inference" in args else "train.total_ips"
            epochs = [x["data"] for x in records if x.get("step") == [1]]  # DLE's benchmark reads the epoch's line
            self.assertEqual(len(epochs), 1, records)
            self.assertGreater(epochs[0][key], 0, epochs[0])
        else:
            self.assertIn("done: 2 steps", r.stdout)

    def check_timm_config(self, words, config, stderr):
        """Every flag of a train.params line against the resolved configuration."""
        flags = timm_flags(words)
        unread = set(flags) - set(fixtures.TIMM_TRAIN_FLAGS) - TIMM_OTHER
        self.assertEqual(unread, set(), "flags this test does not read")
        for flag, value in flags.items():
            if flag in fixtures.TIMM_TRAIN_FLAGS:
                field, read = fixtures.TIMM_TRAIN_FLAGS[flag]
                self.assertEqual(config[field], read(value), f"{flag} {value}")
        self.assertEqual(config["precision"], "amp" if "--amp" in flags else "fp32")
        if "--model-ema" in flags:
            self.assertGreater(config["ema"], 0)
            self.assertFalse(config["ema_warmup"])  # timm's ModelEmaV2: no warm-up
        if flags.get("--enable-distill") == "False":
            self.assertEqual((config["teacher"], config["teacher_img_size"]), ("", 0))
        else:
            self.assertEqual(config["teacher"], flags["--teacher"])
        # DLE's GPUNet train.py builds gpunet_* from its JSON definition and ignores --drop/--drop-connect: so do we.
        self.assertIn("--drop/--drop-connect are ignored for " + config["arch"], stderr)
        # What timm's train.py does with the flags it was not given: absolute LR per epoch, 3 warm-up epochs.
        self.assertEqual((config["lr_reference_batch"], config["lr_granularity"], config["warmup"]), (0, "epoch", 3))
        self.assertEqual(config["train_interpolation"], "random")

    def test_gpunet_train_sh_lines_parse_and_gpunet_0_runs_without_amp(self):
        # train.sh N DATA ARGS is torch.distributed.launch over N processes of train.py ARGS (GPUNet's README).
        path = os.path.join(REFERENCE, "recipes", "gpunet_train_params.json")
        with open(path) as f:
            recipes = json.load(f)["recipes"]
        self.assertEqual(len(recipes), 7)
        for name, words in recipes.items():
            self.assertEqual(words[:3], ["./train.sh", "8", "/root/data/imagenet/"])
            with self.subTest(line=name):
                args = ["train", "--nproc_per_node", "2", IMAGENET_LIKE, *words[3:], "--print-config"]
                if "--teacher" in words:
                    # timm downloads the teacher's weights; convnets asks for the file.
                    r = runner.run([BIN, *args], capture_output=True, text=True, timeout=120)
                    self.assertEqual(r.returncode, 1)
                    self.assertIn("error: --teacher-checkpoint must be given with --teacher", r.stderr)
                    args += ["--teacher-checkpoint", "tf_efficientnet_b5.pth"]
                r = runner.run([BIN, *args], capture_output=True, text=True, timeout=120)
                self.assertEqual(r.returncode, 0, r.stderr)
                self.check_timm_config(words[3:], json.loads(r.stdout), r.stderr)
        # GPUNet-0's line runs as printed but for --amp (the CPU's refusal is checked above), data shortened.
        words = [w for w in recipes["GPUNet-0"][3:] if w != "--amp"]
        words[words.index("--num-classes") + 1] = "10"  # the folder's classes
        cwd = tempfile.mkdtemp(dir=self.tmp)
        args = ["train", IMAGENET_LIKE, *words, "--prof", "1", "--max-val-images", "8"]
        args[args.index("-b") + 1] = "2"
        args[args.index("--epochs") + 1] = "1"
        r = runner.run([BIN, *args], capture_output=True, text=True, timeout=600, cwd=cwd)
        self.assertEqual(r.returncode, 0, f"convnets {' '.join(args)}:\n{r.stdout[-2000:]}{r.stderr}")
        self.assertIn("done: 1 steps", r.stdout)


class DleCopies(unittest.TestCase):
    """The DLE text this module quotes and the presets convnets reads from it, against copies of DLE's files in
    ../shared/reference/dle (skipped, by name, where there are none)."""

    def setUp(self):
        require_dle_copies()

    def test_launch_py_presets_are_configs_ymls(self):
        # What a DGXA100 line resolves to, for each mode of DLE's configs.yml, against what launch.py sets from that
        # file (the model's 250-epoch DGXA100 recipe under the mode's block), and a benchmark_training line run in
        # fp32 on the CPU: its report, and no checkpoint (the mode's).
        base = ["train", "--model", "resnet50", "--platform", "DGXA100", "--precision", "FP32", IMAGENET_LIKE]
        with open(os.path.join(DLE_COPIES, "configs.yml")) as f:
            configs = yaml.safe_load(f)
        # configs.yml has no DGXA100 FP32 block (launch.py would stop at a KeyError): its fp32-weights block there is
        # TF32's, FP32 math on the CPU, and the one convnets' --platform DGXA100 carries.
        self.assertEqual(sorted(configs["models"]["resnet50"]["DGXA100"]), ["AMP", "TF32"])
        self.assertEqual(set(configs["mode"]), {"benchmark_training", "benchmark_training_short",
                                                "benchmark_inference", "evaluate", "convergence"})
        for mode, block in configs["mode"].items():
            with self.subTest(mode=mode):
                self.assertLessEqual(set(block), set(LAUNCH_FIELDS), "a field of the mode this test does not read")
                dle = launch_config("resnet50", "DGXA100", "TF32", mode)
                expected = {ours: read(dle[theirs]) for theirs, (ours, read) in LAUNCH_FIELDS.items() if theirs in dle}
                self.assertIn("epochs", expected)  # the mode's, else the model's
                r = runner.run([BIN, *base, "--mode", mode, "--print-config"], capture_output=True, text=True,
                               timeout=120)
                self.assertEqual(r.returncode, 0, r.stderr)
                config = json.loads(r.stdout)
                self.assertEqual({k: config[k] for k in expected}, expected)
                self.assertEqual(config["precision"], "amp" if dle["amp"] else "fp32")
                # DLE's lr is for its optimizer batch (8 GPUs of 256 on a DGX A100; DLE accumulates to it on fewer);
                # convnets' is per lr_reference_batch images, scaled to the batch.
                self.assertAlmostEqual(config["lr"] * config["optimizer_batch_size"] / config["lr_reference_batch"],
                                       dle["lr"])
                # NCHW where configs.yml sets no memory format: main.py's default.
                self.assertEqual(config["memory_format"], dle.get("memory_format", "nchw"))
    def test_the_copies_are_dles_files_unchanged(self):
        commit, files = dle_copies()
        self.assertEqual(sorted(files), ["LICENSE", "README.resnet50v1.5.md", "configs.yml"])
        for name, (path, blob) in files.items():
            with open(os.path.join(DLE_COPIES, name), "rb") as f:
                data = f.read()
            with self.subTest(copy=name):
                self.assertEqual(hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest(), blob,
                                 f"{DLE_COPIES}/{name} is not {path} at {commit}")
        # CURRENT_LINES name the same file at the same commit.
        repo_commit, readme = CURRENT_README.split(" ")
        self.assertEqual(repo_commit, "NVIDIA/DeepLearningExamples@" + commit[:8])
        self.assertTrue(files["README.resnet50v1.5.md"][0].endswith("/" + readme))

    def test_todays_lines_are_the_current_readmes_own(self):
        # Each line, with its A|B|C, is in the README's copy as printed (whitespace as the page wraps it aside).
        with open(os.path.join(DLE_COPIES, "README.resnet50v1.5.md"), encoding="utf-8") as f:
            text = " ".join(f.read().split())
        for readme, line in CURRENT_LINES:
            with self.subTest(line=line):
                self.assertEqual(readme, CURRENT_README)
                self.assertTrue(" ".join(line.split()) in text, "not in the README's copy in " + DLE_COPIES)


if __name__ == "__main__":
    unittest.main()
