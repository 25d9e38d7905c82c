#!/usr/bin/env python3
"""Write torchvision reference data for the C++ equivalence tests.

For each arch: random weights (BN affine parameters and running statistics
randomised too, so BN is not the identity), an input batch, eval-mode logits,
train-mode logits and the BN buffers after that train-mode forward.
Usage: make_torchvision_reference.py OUTDIR

The data depends only on this script, the safetensors writer and the torch and torchvision versions: OUTDIR's
made_by.json records those, and a run that finds the same record reuses the data (12 s of the quick set otherwise).
"""
import hashlib
import importlib.metadata
import json
import os
import sys

ARCHS = ["resnet18", "resnet50", "resnext50_32x4d"]


def randomise_bn(model, gen):
    import torch
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.weight.uniform_(0.5, 1.5, generator=gen)
                m.bias.normal_(0.0, 0.1, generator=gen)
                m.running_mean.normal_(0.0, 0.1, generator=gen)
                m.running_var.uniform_(0.5, 1.5, generator=gen)
                m.num_batches_tracked.fill_(7)


def made_by():
    here = os.path.dirname(os.path.abspath(__file__))
    sources = [os.path.abspath(__file__), os.path.join(here, "..", "..", "tools", "pth2safetensors.py")]
    digests = {}
    for path in sources:
        with open(path, "rb") as f:
            digests[os.path.basename(path)] = hashlib.sha256(f.read()).hexdigest()
    # From the distributions' metadata: importing torchvision alone takes 4 s, the whole of a reuse otherwise.
    return {"sources_sha256": digests, "torch": importlib.metadata.version("torch"),
            "torchvision": importlib.metadata.version("torchvision"), "archs": ARCHS}


def main(outdir):
    os.makedirs(outdir, exist_ok=True)
    record_path = os.path.join(outdir, "made_by.json")
    record = made_by()
    try:
        with open(record_path) as f:
            if json.load(f) == record:
                print(f"reference data in {outdir} reused: same script, writer, torch and torchvision")
                return
    except (OSError, ValueError):
        pass
    # The record goes last: data cut short by a kill is made again.
    if os.path.exists(record_path):
        os.remove(record_path)
    import torch
    import torchvision
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools"))
    from pth2safetensors import write_safetensors
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    for i, arch in enumerate(ARCHS):
        torch.manual_seed(1000 + i)
        gen = torch.Generator().manual_seed(2000 + i)
        model = getattr(torchvision.models, arch)()
        randomise_bn(model, gen)
        write_safetensors(os.path.join(outdir, f"{arch}.weights.safetensors"), model.state_dict(),
                          {"format": "pt", "arch": arch, "source": "torchvision " + torchvision.__version__})
        x = torch.randn(4, 3, 96, 96, generator=gen)
        with torch.no_grad():
            model.eval()
            eval_logits = model(x)
            model.train()
            train_logits = model(x)
        write_safetensors(os.path.join(outdir, f"{arch}.io.safetensors"),
                          {"input": x, "eval_logits": eval_logits, "train_logits": train_logits})
        write_safetensors(os.path.join(outdir, f"{arch}.after_train.safetensors"), model.state_dict())
        print(f"{arch}: wrote reference data to {outdir}")
    with open(record_path, "w") as f:
        json.dump(record, f, indent=2)


if __name__ == "__main__":
    main(sys.argv[1])
