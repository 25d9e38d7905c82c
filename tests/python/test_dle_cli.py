"""DLE's command lines through `convnets train`: flags, aliases and values mean what they mean in DLE's main.py
and in GPUNet's train.py (timm 0.5.4's).

The configurations of DLE's ConvNets configs.yml (../shared/reference/recipes/
dle_convnets_configs.json, resolved per model, platform and precision, with
DLE's absolute lr) go through convnets' flag parser (`train --print-config`)
and every value is checked against the resolved config. Short Fashion-MNIST
runs check the flags that change a run: --run-epochs, --no-checkpoints,
--raport-file, and the best checkpoint chosen by the EMA. Each GPUNet train.params
command line (../shared/reference/recipes/gpunet_train_params.json) is read the same way.
"""
import csv
import json
import os
import tempfile
import unittest

import fixtures  # the suite's shared tables (tests/python/fixtures.py)
import runner

BIN = os.environ["CONVNETS_BIN"]
SHARED = os.environ.get("CONVNETS_SHARED_DIR", "")
CONFIGS = os.path.join(SHARED, "reference", "recipes", "dle_convnets_configs.json")
GPUNET_PARAMS = os.path.join(SHARED, "reference", "recipes", "gpunet_train_params.json")
FASHION = "/usr/share/datasets/fashion-mnist"
TINY = ["--recipe", "fashion-mnist-resnet8", "--max-train-images", "512", "--max-val-images", "256",
        "--batch-size", "64", "--print-freq", "4", "--epochs", "2", "--warmup", "0"]


def convnets(*args, timeout=600):
    return runner.run([BIN, *args], capture_output=True, text=True, timeout=timeout)


def resolved(*args):
    r = convnets("train", "--print-config", *args)
    if r.returncode != 0:
        raise AssertionError(f"train --print-config {' '.join(args)}: {r.stderr}")
    return json.loads(r.stdout)


def dllogger(path):
    with open(path) as f:
        return [json.loads(line[5:]) for line in f]


# configs.yml key -> (DLE's flag, convnets' field, how DLE's value reads in convnets)
DLE_ARCHS = {"resnet50": "resnet50", "resnext101-32x4d": "resnext101_32x4d",
             "se-resnext101-32x4d": "se_resnext101_32x4d"}
DLE_KEYS = {
    "arch": ("--arch", "arch", DLE_ARCHS.get),
    "batch_size": ("-b", "batch_size", None),
    "optimizer_batch_size": ("--optimizer-batch-size", "optimizer_batch_size", None),
    "lr": ("--lr", "lr", None),
    "weight_decay": ("--wd", "weight_decay", None),
    "momentum": ("--momentum", "momentum", None),
    "warmup": ("--warmup", "warmup", None),
    "epochs": ("--epochs", "epochs", None),
    "label_smoothing": ("--label-smoothing", "label_smoothing", None),
    "mixup": ("--mixup", "mixup", None),
    "lr_schedule": ("--lr-schedule", "lr_schedule", None),
    "workers": ("-j", "workers", None),
    "prefetch": ("--prefetch", "prefetch", None),
    "data_backend": ("--data-backend", "data_backend", {"pytorch": "cpu", "dali-cpu": "cpu", "dali-gpu": "gpu"}.get),
    "num_classes": ("--num_classes", "num_classes", None),
    "image_size": ("--image-size", "image_size", None),
    "interpolation": ("--interpolation", "interpolation", None),
    "memory_format": ("--memory-format", "memory_format", None),
    "static_loss_scale": ("--static-loss-scale", "static_loss_scale", None),
}


def dle_args(values):
    args = []
    for key, value in values.items():
        if key == "amp":
            args += ["--amp"] if value else []
        elif key == "gpu_affinity":
            args += ["--gpu-affinity", value]
        else:
            args += [DLE_KEYS[key][0], str(value)]
    return args


@unittest.skipUnless(os.path.isfile(CONFIGS), "../shared/reference/recipes is not beside the clone (CI has it)")
class DleConfigsReadAsDle(unittest.TestCase):
    def test_every_configuration_resolves_field_by_field(self):
        with open(CONFIGS) as f:
            configs = json.load(f)["configs"]
        self.assertEqual(len(configs), 32)
        for entry in configs:
            name = f"{entry['model']} {entry['platform']} {entry['precision']}"
            values = dict(entry["values"])
            values.setdefault("arch", entry["model"])  # the FP32 blocks inherit it from the model block
            affinity = values.pop("gpu_affinity", "none")
            with self.subTest(config=name):
                if affinity != "none":
                    # DLE pins CPU cores per GPU through NVML; convnets refuses the mode by name.
                    r = convnets("train", "--print-config", *dle_args(values), "--gpu-affinity", affinity)
                    self.assertNotEqual(r.returncode, 0)
                    self.assertIn("--gpu-affinity " + affinity, r.stderr)
                config = resolved(*dle_args(values))
                unchecked = set(values) - set(DLE_KEYS) - {"amp"}
                self.assertEqual(unchecked, set(), "configs.yml keys this test does not map")
                for key, value in values.items():
                    if key == "amp":
                        self.assertEqual(config["precision"], "amp" if value else "fp32")
                        continue
                    _, field, convert = DLE_KEYS[key]
                    self.assertEqual(config[field], convert(value) if convert else value, f"{key} of {name}")
                # DLE's lr is absolute and its policies change the LR per epoch.
                self.assertEqual(config["lr_reference_batch"], 0)
                self.assertEqual(config["lr_granularity"], "epoch")

    def test_launch_py_platform_dgxa100_is_its_configuration(self):
        # launch.py --model M --platform DGXA100 --precision P resolves to configs.yml's block, field by field;
        # the LR as the optimizer applies it (convnets' per-256 LR times the optimizer batch).
        with open(CONFIGS) as f:
            configs = [c for c in json.load(f)["configs"] if c["platform"] == "DGXA100"]
        self.assertEqual(len(configs), 6)
        for entry in configs:
            v = entry["values"]
            with self.subTest(model=entry["model"], precision=entry["precision"]):
                c = resolved("--model", entry["model"], "--platform", "DGXA100", "--precision", entry["precision"])
                lr = c["lr"] * c["optimizer_batch_size"] / c["lr_reference_batch"] if c["lr_reference_batch"] else c["lr"]
                self.assertAlmostEqual(lr, v["lr"], places=12)
                self.assertEqual(c["precision"], "amp" if v["amp"] else "tf32")
                self.assertEqual(c["memory_format"], v.get("memory_format", "nchw"))  # main.py's default
                # 0 and "" are the arch's own input size and interpolation, what `convnets models` says they
                # are; the class count 0 is the data's (ImageNet's 1,000 there).
                self.assertEqual(c["num_classes"], 0)
                arch = json.loads(convnets("models", "--arch", c["arch"], "--json").stdout)
                self.assertEqual(c["image_size"] or arch["input_size"], v["image_size"])
                self.assertEqual(c["interpolation"] or arch["interpolation"], v["interpolation"])
                for key in ("arch", "batch_size", "optimizer_batch_size", "epochs", "warmup", "weight_decay",
                            "momentum", "label_smoothing", "mixup", "lr_schedule"):
                    _, field, convert = DLE_KEYS[key]
                    self.assertEqual(c[field], convert(v[key]) if convert else v[key], key)
                if v["amp"]:
                    self.assertEqual(c["static_loss_scale"], v["static_loss_scale"])

    def test_builtin_recipes_are_the_dgxa100_amp_configurations(self):
        # The recipes give the LR per 256 images; scaled to configs.yml's optimizer batch it is its lr.
        with open(CONFIGS) as f:
            configs = {c["model"]: c["values"] for c in json.load(f)["configs"]
                       if (c["platform"], c["precision"]) == ("DGXA100", "AMP")}
        self.assertEqual(set(configs), set(DLE_ARCHS))
        for model, v in configs.items():
            for epochs, mixup in ((250, v["mixup"]), (90, 0.0)):  # DLE's README runs 90 epochs with --mixup 0.0
                with self.subTest(model=model, epochs=epochs):
                    c = resolved("--recipe", f"{model}-{epochs}ep", "--optimizer-batch-size",
                                 str(v["optimizer_batch_size"]))
                    self.assertAlmostEqual(c["lr"] * v["optimizer_batch_size"] / c["lr_reference_batch"], v["lr"],
                                           places=12)
                    self.assertEqual((c["arch"], c["batch_size"], c["epochs"], c["mixup"]),
                                     (DLE_ARCHS[model], v["batch_size"], epochs, mixup))
                    for key in ("weight_decay", "momentum", "warmup", "label_smoothing", "lr_schedule",
                                "static_loss_scale", "memory_format"):
                        self.assertEqual(c[key], v[key], key)
                    self.assertEqual(c["precision"], "amp")

    def test_a_changed_value_is_seen(self):
        # The comparison must be able to fail: another --wd is another weight decay.
        self.assertNotEqual(resolved("--wd", "1e-4")["weight_decay"], 3.0517578125e-05)


@unittest.skipUnless(os.path.isfile(GPUNET_PARAMS), "../shared/reference/recipes is not beside the clone (CI has it)")
class GpunetCommandLinesReadAsTimm(unittest.TestCase):
    def test_every_train_params_line_resolves_field_by_field(self):
        with open(GPUNET_PARAMS) as f:
            recipes = json.load(f)["recipes"]
        self.assertEqual(len(recipes), 7)
        for name, tokens in recipes.items():
            with self.subTest(recipe=name):
                self.assertEqual(tokens[0], "./train.sh")  # then the GPU count and the data folder
                args, expected, distill, k = tokens[3:], {}, None, 3
                while k < len(tokens):
                    flag = tokens[k]
                    if flag == "--model-ema":
                        expected["ema_warmup"] = False  # timm's ModelEmaV2 has no warm-up
                        k += 1
                    elif flag == "--amp":
                        expected["precision"] = "amp"
                        k += 1
                    else:
                        if flag == "--enable-distill":
                            distill = {"True": True, "False": False}[tokens[k + 1]]
                        elif flag not in fixtures.TIMM_IGNORED:
                            self.assertIn(flag, fixtures.TIMM_TRAIN_FLAGS, "a train.params flag this test does not map")
                            field, convert = fixtures.TIMM_TRAIN_FLAGS[flag]
                            expected[field] = convert(tokens[k + 1])
                        k += 2
                if distill:
                    # timm downloads the teacher's pretrained weights; convnets takes them as a file.
                    args += ["--teacher-checkpoint", "teacher.safetensors"]
                config = resolved(tokens[2], *args)
                # The arch's own rates, shown as the values in use: DLE's gpunet_* builders' 0.2 each, and no
                # drop-path in the distill=true (GPUNet-D) blocks.
                distilled = tokens[tokens.index("--model") + 1].startswith("gpunet_d")
                self.assertEqual((config["dropout"], config["drop_path"]), (0.2, 0.0 if distilled else 0.2))
                for field, value in expected.items():
                    self.assertEqual(config[field], value, f"{field} of {name}")
                if not distill:
                    self.assertEqual(config["teacher"], "")
                # timm's train.py defaults where the line is silent, and timm's absolute LR per epoch.
                self.assertEqual((config["warmup"], config["train_interpolation"]), (3, "random"))
                self.assertEqual((config["lr_reference_batch"], config["lr_granularity"]), (0, "epoch"))
                self.assertEqual((config["mixup"], config["cutmix"], config["label_smoothing"]), (0, 0, 0.1))
                self.assertEqual(config["best_by"], "auto")  # the EMA's top-1, as GPUNet's train.py

    def test_timm_flags_yield_to_recipes_and_explicit_fields(self):
        # --sched and --model-ema bring timm's defaults only where nothing else set the field.
        c = resolved("--recipe", "gpunet-d1-450ep", "--teacher-checkpoint", "t.safetensors", "--sched", "step",
                     "--model-ema")
        self.assertEqual((c["ema"], c["warmup"], c["warmup_lr"]), (0.9999, 3, 1e-06))
        c = resolved("--recipe", "resnet50-90ep", "--sched", "cosine", "--model-ema")  # the recipe names no filter
        self.assertEqual((c["warmup"], c["train_interpolation"], c["ema"], c["ema_warmup"]), (8, "random", 0.9998, False))
        c = resolved("--sched", "step", "--warmup-epochs", "5")
        self.assertEqual((c["warmup"], c["warmup_lr"], c["train_interpolation"]), (5, 1e-4, "random"))
        # --enable-distill False drops the teacher whatever else names one.
        c = resolved("--recipe", "gpunet-d1-450ep", "--enable-distill", "False", "--teacher", "tf_efficientnet_b5_ns")
        self.assertEqual((c["teacher"], c["teacher_img_size"], c["test_teacher"]), ("", 0, False))
        # An explicit --dropout wins over timm's --drop on archs where --drop applies.
        self.assertEqual(resolved("--model", "resnet50", "--dropout", "0.1", "--drop", "0.3")["dropout"], 0.1)

    def test_timm_drop_applies_to_other_archs(self):
        c = resolved("--model", "resnet50", "--drop", "0.3", "--drop-connect", "0.1")
        self.assertEqual((c["dropout"], c["drop_path"]), (0.3, 0.1))
        r = convnets("train", "--print-config", "--model", "gpunet_1", "--drop", "0.3")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("--drop/--drop-connect are ignored for gpunet-1", r.stderr)
        self.assertEqual(json.loads(r.stdout)["dropout"], 0.2)  # the arch's, not --drop's

    def test_gpunet_archs_evaluate_as_timm(self):
        # timm's default_cfg: bicubic, crop_pct 1.0 (0.875 for P0/P1), at each definition's resolution.
        r = convnets("models", "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        archs = {a["name"]: a for a in json.loads(r.stdout)}
        with open(GPUNET_PARAMS) as f:
            recipes = json.load(f)["recipes"]
        for name, tokens in recipes.items():
            arch = archs[tokens[tokens.index("--model") + 1].replace("_", "-")]
            self.assertEqual(arch["interpolation"], "bicubic", name)
            self.assertEqual(arch["crop_ratio"], float(tokens[tokens.index("--crop-pct") + 1]), name)
            self.assertEqual(arch["input_size"], int(tokens[tokens.index("--img-size") + 1]), name)


class DleFlags(unittest.TestCase):
    def test_lr_is_absolute_unless_a_reference_batch_is_given(self):
        # DLE's README: --lr 2.048 with --optimizer-batch-size 2048 is the rate, not 8x it.
        c = resolved("--recipe", "resnet50-90ep", "--lr", "2.048", "--optimizer-batch-size", "2048")
        self.assertEqual((c["lr"], c["lr_reference_batch"]), (2.048, 0))
        c = resolved("--recipe", "resnet50-90ep")  # the recipe's per-256 LR stays scaled
        self.assertEqual((c["lr"], c["lr_reference_batch"]), (0.256, 256))
        c = resolved("--recipe", "resnet50-90ep", "--lr", "0.1", "--lr-reference-batch", "128")
        self.assertEqual((c["lr"], c["lr_reference_batch"]), (0.1, 128))

    def test_aliases_and_value_spellings(self):
        c = resolved("-a", "se-resnext101-32x4d", "-b", "64", "-j", "3", "-p", "7", "--wd", "1e-4",
                     "--learning-rate", "0.5", "--use-ema", "0.99", "--topk", "3", "--rmsprop-eps", "0.01",
                     "--data-backend", "dali-gpu", "--amp", "--gather-checkpoints", "2")
        self.assertEqual(c["arch"], "se_resnext101_32x4d")
        self.assertEqual((c["batch_size"], c["workers"], c["print_freq"]), (64, 3, 7))
        self.assertEqual((c["weight_decay"], c["lr"], c["ema"], c["top_k"], c["opt_eps"]), (1e-4, 0.5, 0.99, 3, 0.01))
        self.assertEqual((c["data_backend"], c["precision"]), ("gpu", "amp"))
        self.assertEqual((c["save_every"], c["keep"]), (1, 2))  # DLE keeps the last N per-epoch checkpoints
        self.assertEqual(resolved("--gather-checkpoints", "-1")["save_every"], 0)

    def test_the_resnet50_readme_lines_read_as_dle_reads_them(self):
        # The seed README's line, as printed: -c fanin is DLE's fan_in Kaiming init, --static-loss-scale the scale
        # today's main.py starts its GradScaler from (doubled after 100 clean steps); --dynamic-loss-scale, the
        # seed's apex flag, makes it convnets' own dynamic one (0).
        c = resolved("--arch", "resnet50", "-c", "fanin", "--label-smoothing", "0.1", "--amp",
                     "--static-loss-scale", "256")
        self.assertEqual((c["init"], c["precision"], c["static_loss_scale"]), ("fan_in", "amp", 256))
        self.assertEqual(resolved("--model-config", "classic")["init"], "fan_out")
        self.assertEqual(resolved("-c", "grp-fanout")["init"], "fan_out")
        self.assertEqual(resolved("--static-loss-scale", "256", "--dynamic-loss-scale")["static_loss_scale"], 0)
        # What torch.distributed.launch passes; DLE's spelling of its synthetic backend; bare --gather-checkpoints.
        self.assertEqual(resolved("--local_rank", "0")["arch"], "resnet50")
        c = resolved("/data/imagenet", "--data-backend", "syntetic")
        self.assertEqual((c["data"], c["data_backend"]), ("synthetic", "auto"))
        c = resolved("--gather-checkpoints")
        self.assertEqual((c["save_every"], c["keep"]), (1, 0))
        # Refused with the convnets equivalent named.
        for args, message, hint in ((["--fp16"], "--fp16: convnets does not train in pure fp16", "use --amp"),
                                    (["--arch", "se-resnet50"], "is not built in convnets", "se-resnext101-32x4d"),
                                    (["-c", "fanout"], "--model-config", "")):
            r = convnets("train", "--print-config", *args)
            self.assertNotEqual(r.returncode, 0, args)
            self.assertIn(message, r.stderr)
            self.assertIn(hint, r.stderr)

    def test_every_option_of_dles_main_py_reads_or_names_its_equivalent(self):
        # main.py's options beyond the README's lines (image_classification/ and main.py's parser): DLE's defaults
        # and torch.optim.RMSprop read as DLE means them.
        c = resolved("--jit", "no", "--optimizer-batch-size", "-1", "--optimizer", "rmsprop", "--rmsprop-alpha", "0.95",
                     "--rmsprop-eps", "1e-4", "--early-stopping-patience", "3")
        self.assertEqual((c["optimizer_batch_size"], c["optimizer"], c["rmsprop_alpha"], c["opt_eps"],
                          c["early_stopping_patience"]), (-1, "rmsprop", 0.95, 1e-4, 3))
        self.assertEqual(resolved("--opt", "rmsprop")["optimizer"], "rmsprop")  # timm's name for the same
        for command, args, message, hint in (
                ("train", ["--jit", "script"], "--jit script: convnets is C++ on LibTorch", "--cuda-graph"),
                ("train", ["--checkpoint-filename", "c.pth.tar"], "--checkpoint-filename c.pth.tar",
                 "last.safetensors"),
                ("train", ["--pretrained"], "--pretrained: convnets downloads nothing", "--pretrained-from-file"),
                ("train", ["--trt"], "--trt:", "convnets export --format onnx"),
                ("train", ["--early-stopping-patience", "3", "--training-only"], "--early-stopping-patience",
                 "--training-only"),
                ("classify", ["x.jpg", "--arch", "resnet50", "--pretrained"], "--pretrained: convnets downloads nothing",
                 "--pretrained-from-file")):
            r = convnets(command, *([] if command == "classify" else ["--print-config"]), *args)
            self.assertNotEqual(r.returncode, 0, args)
            self.assertIn(message, r.stderr)
            self.assertIn(hint, r.stderr)

    def test_refusals_name_the_flag(self):
        for args, flag in ((["--interpolation", "lanczos"], "--interpolation"),
                           (["--aa", "rand-m9-x1"], "--augment"),
                           (["--remode", "noise"], "--remode"),
                           (["--sched", "plateau"], "--sched"),
                           (["--test-teacher", "maybe"], "--test-teacher"),
                           (["--raport-file", "config.json"], "--raport-file"),
                           (["--warmup", "0.5", "--epochs", "2"], "--warmup"),
                           (["--best-by", "ema"], "--best-by"),
                           (["--teacher", "resnet8", "--teacher-checkpoint", "t.safetensors", "--teacher-two-res"],
                            "--teacher-two-res")):
            r = convnets("train", "--print-config", *args)
            self.assertNotEqual(r.returncode, 0, args)
            self.assertIn(flag, r.stderr)


@unittest.skipUnless(os.path.isdir(FASHION), "Debian's dataset-fashion-mnist is not installed (scripts/setup.sh)")
class DleRunFlags(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="convnets-dle-")
        self.ws = os.path.join(self.tmp.name, "run")

    def tearDown(self):
        self.tmp.cleanup()

    def test_run_epochs_stops_and_resume_finishes(self):
        r = convnets("train", *TINY, "--run-epochs", "1", "--raport-file", "raport.json", "--workspace", self.ws)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("stopped after --run-epochs 1 at epoch 1/2", r.stdout)
        self.assertFalse(os.path.exists(os.path.join(self.ws, "log.json")))
        epochs = [x["step"] for x in dllogger(os.path.join(self.ws, "raport.json")) if len(x.get("step", [])) == 1]
        self.assertEqual(epochs, [[1]])
        # Another run may not overwrite this run's log.
        r = convnets("train", *TINY, "--raport-file", "raport.json", "--workspace", self.ws)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("already holds a run", r.stderr)
        r = convnets("train", "--resume", os.path.join(self.ws, "last.safetensors"))
        self.assertEqual(r.returncode, 0, r.stderr)
        records = [x for x in dllogger(os.path.join(self.ws, "raport.json")) if len(x.get("step", [])) == 1]
        self.assertEqual([x["step"] for x in records], [[1], [2]])
        # timm's summary.csv beside it: a row per epoch, the same figures.
        with open(os.path.join(self.ws, "summary.csv")) as f:
            rows = list(csv.DictReader(f))
        self.assertEqual([int(row["epoch"]) for row in rows], [1, 2])
        for row, x in zip(rows, records):
            for column, key in (("train_loss", "train.loss"), ("eval_loss", "val.loss"), ("eval_top1", "val.top1"),
                                ("eval_top5", "val.top5"), ("lr", "train.lr")):
                self.assertEqual(float(row[column]), x["data"][key], column)

    def test_evaluate_benchmark_line_writes_the_raport_file(self):
        # The ResNet-50 README's inference benchmark, data and --prof shortened: no weights (DLE evaluates the
        # network as initialised), --prof N batches, and the DLLogger file DLE's benchmark reads in the workspace.
        line = ["--arch", "resnet50", "-p", "1", "--raport-file", "benchmark.json", "--epochs", "1", "--prof", "2",
                "--evaluate", "-b", "8", "--image-size", "32", "--workspace", self.ws, FASHION]
        r = convnets("train", *line)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("evaluates randomly initialised weights (as DLE's main.py does)", r.stderr)
        self.assertIn("val 2/2", r.stdout)  # --prof 2: two batches of the 10,000 images
        records = dllogger(os.path.join(self.ws, "benchmark.json"))
        self.assertEqual([x["step"] for x in records], ["PARAMETER", [1], []])
        self.assertTrue(records[0]["data"]["evaluate"])
        summary = records[2]["data"]
        for key in ("val.top1", "val.top5", "val.loss", "val.compute_ips", "val.total_ips", "val.compute_latency",
                    "val.compute_latency_at95", "val.compute_latency_at99", "val.compute_latency_at100"):
            self.assertIsInstance(summary[key], float, key)
        self.assertEqual(summary, records[1]["data"])
        self.assertLessEqual(summary["val.compute_latency_at99"], summary["val.compute_latency_at100"])
        self.assertEqual(sorted(os.listdir(self.ws)), ["benchmark.json"])  # no checkpoint, no other log
        # The next benchmark rewrites its own file; a training run's log is never written over.
        self.assertEqual(convnets("train", *line).returncode, 0)
        self.assertEqual(len(dllogger(os.path.join(self.ws, "benchmark.json"))), 3)
        trained = os.path.join(self.ws, "log.json")
        with open(trained, "w") as f:
            f.write('DLLL {"type": "LOG", "step": "PARAMETER", "data": {"evaluate": false}}\n')
        r = convnets("train", *[a if a != "benchmark.json" else "log.json" for a in line])
        self.assertEqual(r.returncode, 1)
        self.assertIn(f"--evaluate: {trained} is the log of a training run", r.stderr)
        with open(trained) as f:
            self.assertEqual(f.read().count("\n"), 1)
        # Without --raport-file an evaluation writes nothing, also where a training run's log is.
        r = convnets("train", *[a for a in line if a not in ("--raport-file", "benchmark.json")])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(sorted(os.listdir(self.ws)), ["benchmark.json", "log.json"])

    def test_augmentation_policies_train_end_to_end(self):
        # timm's GPUNet augmentations and DLE's AutoAugment through the CLI: each run trains, and differs from
        # the plain run with the same seed (the policy reached the images).
        losses = {}
        for name, extra in (("plain", []),
                            ("randaugment", ["--aa", "rand-m9-mstd0.5", "--reprob", "0.25", "--remode", "pixel",
                                             "--train-interpolation", "random"]),
                            ("autoaugment", ["--augmentation", "autoaugment", "--cutmix", "1.0", "--mixup", "0.2"]),
                            ("erasing", ["--reprob", "0.5", "--remode", "rand", "--recount", "2"])):
            ws = os.path.join(self.tmp.name, name)
            r = convnets("train", *TINY, "--epochs", "1", *extra, "--workspace", ws)
            self.assertEqual(r.returncode, 0, r.stderr)
            loss = [x["data"]["train.loss"] for x in dllogger(os.path.join(ws, "log.json"))
                    if len(x.get("step", [])) == 1][0]
            self.assertTrue(0 < loss < 10, (name, loss))
            losses[name] = loss
        for name in ("randaugment", "autoaugment", "erasing"):
            self.assertNotEqual(losses[name], losses["plain"], name)

    def test_early_stopping_ends_the_run_patience_epochs_after_its_best(self):
        # DLE's --early-stopping-patience N: the run ends once N epochs have passed since the best top-1. At LR 0
        # only BN's running statistics move, so top-1 soon stops improving.
        r = convnets("train", *TINY, "--epochs", "8", "--lr", "0", "--early-stopping-patience", "2",
                     "--workspace", self.ws)
        self.assertEqual(r.returncode, 0, r.stderr)
        log = dllogger(os.path.join(self.ws, "log.json"))
        top1 = [x["data"]["val.top1"] for x in log if len(x.get("step", [])) == 1]
        best = top1.index(max(top1)) + 1  # the first epoch at the maximum: later equal ones are no improvement
        self.assertLess(len(top1), 8, top1)
        self.assertEqual(len(top1), best + 2, top1)
        self.assertIn(f"early stopping: top-1 has not improved for 2 epochs (best at epoch {best}; "
                      f"--early-stopping-patience 2), stopped at epoch {best + 2}/8", r.stdout)
        summary = [x for x in log if x.get("step") == []][-1]["data"]
        self.assertEqual((summary["train.early_stopped_at_epoch"], summary["val.best_epoch"]), (best + 2, best))

    def test_no_checkpoints_writes_none(self):
        r = convnets("train", *TINY, "--no-checkpoints", "--workspace", self.ws)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(sorted(os.listdir(self.ws)), ["config.json", "log.json", "summary.csv"])  # logs only

    def test_best_checkpoint_follows_the_ema_when_it_is_on(self):
        r = convnets("train", *TINY, "--ema", "0.5", "--workspace", self.ws)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("best checkpoint by EMA top-1, EMA decay 0.5", r.stdout)
        log = dllogger(os.path.join(self.ws, "log.json"))
        summary = [x for x in log if x.get("step") == []][-1]["data"]
        ema_top1 = [x["data"]["val_ema.top1"] for x in log if len(x.get("step", [])) == 1]
        self.assertEqual(summary["val.best_by"], "ema")
        self.assertEqual(summary["val.best_top1"], max(ema_top1))
        self.assertEqual(summary["val.best_epoch"], ema_top1.index(max(ema_top1)) + 1)


if __name__ == "__main__":
    unittest.main()
