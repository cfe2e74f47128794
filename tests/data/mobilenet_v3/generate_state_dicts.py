"""Writes the state-dict listings of torchvision's MobileNetV3 models that
tests/unit/test_mobilenet.cpp compares dpar's models against.

Run with Debian's interpreter (torch 1.13, torchvision 0.14) from this folder:
    /usr/bin/python3 generate_state_dicts.py
One line per state-dict entry, in state-dict order:
    <param|buffer> <name> <dtype> <shape, comma separated; "scalar" for shape []>
"""
import torch
import torchvision


def listing(model):
    params = {name for name, _ in model.named_parameters()}
    dtypes = {torch.float32: "f32", torch.int64: "i64"}
    lines = []
    for name, t in model.state_dict().items():
        shape = ",".join(str(s) for s in t.shape) if t.dim() else "scalar"
        kind = "param" if name in params else "buffer"
        lines.append(f"{kind} {name} {dtypes[t.dtype]} {shape}")
    return lines


for arch in ("mobilenet_v3_small", "mobilenet_v3_large"):
    model = getattr(torchvision.models, arch)(num_classes=1000)
    with open(f"{arch}.txt", "w") as f:
        f.write(f"# torchvision {torchvision.__version__} {arch}(num_classes=1000)\n")
        f.write("\n".join(listing(model)) + "\n")
