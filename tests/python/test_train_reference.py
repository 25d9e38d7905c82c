"""convnets' training step against torch.optim.SGD (the .venv's torch, CPU).

The probe (tests/train_probe.cpp) runs convnets' train_step on weights and
batches written here; this file recomputes the same steps with torchvision's
resnet18 and torch.optim.SGD and compares parameters, momentum buffers and BN
statistics (max relative error 1e-5 per tensor, relative to the tensor's
largest magnitude). The learning rate of each step is recomputed here from the
schedule's formula (linear warmup, then cosine; per step, or per epoch as DLE's
lr_cosine_policy), independently of convnets.
"""
import json
import math
import os
import subprocess
import sys
import tempfile
import unittest

import torch
import torch.nn.functional as F
import torchvision

sys.path.insert(0, os.path.join(os.environ["CONVNETS_SOURCE_DIR"], "tools"))
import pth2safetensors  # noqa: E402

PROBE = os.environ["CONVNETS_TRAIN_PROBE"]
TOLERANCE = 1e-5


def warmup_cosine_lr(step, base_lr, warmup_epochs, steps_per_epoch, epochs, end_lr=0.0, per_epoch=False):
    if per_epoch:  # DLE ConvNets image_classification/optimizers.py, lr_cosine_policy
        e = step // steps_per_epoch
        if e < warmup_epochs:
            return base_lr * (e + 1) / warmup_epochs
        return end_lr + 0.5 * (1 + math.cos(math.pi * (e - warmup_epochs) / (epochs - warmup_epochs))) * (base_lr - end_lr)
    total = steps_per_epoch * epochs
    warmup = round(warmup_epochs * steps_per_epoch)
    if step < warmup:
        return base_lr * (step + 1) / warmup
    p = (step - warmup) / (total - warmup)
    return end_lr + 0.5 * (base_lr - end_lr) * (1 + math.cos(math.pi * p))


def max_rel(a, b):
    a, b = a.double(), b.double()
    scale = b.abs().max().item()
    diff = (a - b).abs().max().item()
    return diff / scale if scale > 0 else diff


class TrainStepMatchesTorchOptimSGD(unittest.TestCase):
    def run_case(self, *, steps=2, micro=1, batch=4, mixup=0.0, nesterov=True, label_smoothing=0.1,
                 weight_decay=5e-4, bn_weight_decay=False, memory_format="nchw", first_step=5,
                 reference_decay_all=None, schedule=None):
        torch.manual_seed(0)
        torch.set_num_threads(1)
        model = torchvision.models.resnet18(num_classes=10)
        with torch.no_grad():  # non-trivial BN affine and statistics
            for m in model.modules():
                if isinstance(m, torch.nn.BatchNorm2d):
                    m.weight.uniform_(0.5, 1.5)
                    m.bias.uniform_(-0.2, 0.2)
                    m.running_mean.uniform_(-0.1, 0.1)
                    m.running_var.uniform_(0.5, 1.5)
        schedule = schedule or dict(kind="cosine", base_lr=0.4, warmup_epochs=1.0, steps_per_epoch=4, epochs=3,
                                    end_lr=0.0, per_epoch=False)
        inputs = {}
        for s in range(steps):
            for m in range(micro):
                inputs[f"input.{s}.{m}.images"] = torch.randn(batch, 3, 32, 32)
                inputs[f"input.{s}.{m}.labels"] = torch.randint(0, 10, (batch,))
        probe = dict(arch="resnet18", num_classes=10, steps=steps, micro_batches=micro, first_step=first_step,
                     momentum=0.875, nesterov=nesterov, weight_decay=weight_decay, bn_weight_decay=bn_weight_decay,
                     label_smoothing=label_smoothing, mixup=mixup, seed=7, memory_format=memory_format,
                     schedule=schedule)
        with tempfile.TemporaryDirectory() as tmp:
            src, dst = os.path.join(tmp, "in.safetensors"), os.path.join(tmp, "out.safetensors")
            tensors = {"model." + k: v for k, v in model.state_dict().items()}
            tensors.update(inputs)
            pth2safetensors.write_safetensors(src, tensors, {"probe": json.dumps(probe)})
            r = subprocess.run([PROBE, src, dst], capture_output=True, text=True, timeout=300)
            self.assertEqual(r.returncode, 0, r.stderr)
            ours, meta = pth2safetensors.read_safetensors(dst)
        result = json.loads(meta["result"])

        decay_all = bn_weight_decay if reference_decay_all is None else reference_decay_all
        decay = [p for n, p in model.named_parameters() if decay_all or p.ndim > 1]
        no_decay = [p for n, p in model.named_parameters() if not (decay_all or p.ndim > 1)]
        opt = torch.optim.SGD([{"params": decay, "weight_decay": weight_decay},
                               {"params": no_decay, "weight_decay": 0.0}],
                              lr=0.1, momentum=0.875, nesterov=nesterov)
        if memory_format == "nhwc":  # the same kernels as convnets' channels-last path
            model = model.to(memory_format=torch.channels_last)
        model.train()
        for s in range(steps):
            lr = warmup_cosine_lr(first_step + s, **{k: v for k, v in schedule.items() if k != "kind"})
            self.assertAlmostEqual(result["lrs"][s], lr, places=12)
            for g in opt.param_groups:
                g["lr"] = lr
            opt.zero_grad()
            xs = [inputs[f"input.{s}.{m}.images"] for m in range(micro)]
            if memory_format == "nhwc":
                xs = [x.contiguous(memory_format=torch.channels_last) for x in xs]
            ys = [inputs[f"input.{s}.{m}.labels"] for m in range(micro)]
            if mixup > 0:
                mixed, losses = [], []
                for m in range(micro):
                    draw = result["mixup"][s][m]
                    lam, perm = draw["lam"], torch.tensor(draw["perm"])
                    self.assertTrue(0.0 < lam < 1.0)
                    self.assertEqual(sorted(draw["perm"]), list(range(batch)))
                    # DLE's lam * x + (1 - lam) * x[perm], in the one rounding order convnets uses.
                    x = xs[m].mul(lam).add_(xs[m][perm], alpha=1 - lam)
                    out = model(x)
                    loss_m = (lam * F.cross_entropy(out, ys[m], label_smoothing=label_smoothing) +
                              (1 - lam) * F.cross_entropy(out, ys[m][perm], label_smoothing=label_smoothing))
                    # The same loss as DLE writes it: smoothed one-hot targets mixed with lam.
                    target = lam * smooth(ys[m], label_smoothing) + (1 - lam) * smooth(ys[m][perm], label_smoothing)
                    dle = -(target.double() * F.log_softmax(out.double(), 1)).sum(1).mean()
                    self.assertAlmostEqual(loss_m.item(), dle.item(), delta=1e-5 * abs(dle.item()))
                    losses.append(loss_m)
                loss = sum(losses) / micro
            else:
                # One optimizer batch of micro * B images: the mean loss over all
                # of them, BN statistics per micro-batch (each forward separate).
                logits = torch.cat([model(x) for x in xs])
                loss = F.cross_entropy(logits, torch.cat(ys), label_smoothing=label_smoothing)
            self.assertAlmostEqual(result["losses"][s], loss.item(), delta=1e-5 * max(1.0, abs(loss.item())))
            loss.backward()
            opt.step()

        worst = 0.0
        for n, p in model.named_parameters():
            worst = max(worst, max_rel(ours["param." + n], p.detach()))
            worst = max(worst, max_rel(ours["momentum." + n], opt.state[p]["momentum_buffer"]))
        for n, b in model.named_buffers():
            if b.is_floating_point():
                worst = max(worst, max_rel(ours["buffer." + n], b))
            else:
                self.assertTrue(torch.equal(ours["buffer." + n], b), n)
        print(f"\n  measured max relative error {worst:.3g} (steps {steps}, micro {micro}, mixup {mixup}, "
              f"{memory_format})")
        self.assertLess(worst, TOLERANCE)
        return worst

    def test_label_smoothing_nesterov_no_bn_decay_warmup_cosine(self):
        self.run_case()

    def test_per_epoch_schedule_as_dle(self):
        # Steps 1..3 of 2-step epochs with 2 warmup epochs: DLE's 0.2, 0.4, 0.4
        # (the per-step warmup would give 0.2, 0.3, 0.4).
        self.run_case(first_step=1, steps=3, schedule=dict(kind="cosine", base_lr=0.4, warmup_epochs=2.0,
                                                           steps_per_epoch=2, epochs=4, end_lr=0.0, per_epoch=True))

    def test_channels_last_gives_the_same_step(self):
        self.run_case(memory_format="nhwc", steps=1)

    def test_mixup(self):
        self.run_case(mixup=0.2)

    def test_gradient_accumulation_two_micro_batches_equal_one_batch(self):
        self.run_case(micro=2, batch=4)

    def test_plain_momentum_with_bn_weight_decay(self):
        self.run_case(nesterov=False, bn_weight_decay=True, label_smoothing=0.0, first_step=0)

    def test_negative_control_wrong_weight_decay_is_detected(self):
        # The comparison must be able to fail: decaying BN in the reference only.
        with self.assertRaises(AssertionError):
            self.run_case(bn_weight_decay=False, weight_decay=5e-2, steps=1, reference_decay_all=True)


def smooth(y, eps, classes=10):
    return F.one_hot(y, classes).double() * (1 - eps) + eps / classes


if __name__ == "__main__":
    unittest.main()
