"""Checks an exported inference.onnx against PyTorch references, with Debian's python3-onnx.

Usage:
  /usr/bin/python3 tests/parity/onnx_check.py --model DIR/inference.onnx \
      --ref DIR/export_small_ref.safetensors --output probs [--tol 1e-4] \
      [--meta key=value ...] [--ops Conv,Relu,...]

1. onnx.checker.check_model(full_check=True) and strict onnx.shape_inference.
2. Structure: opset >= 14, one input [batch, 3, H, W] float with a symbolic batch dimension,
   one output [batch, classes]; only the ops in --ops (default: the MobileNetV3 export set,
   no BatchNormalization, i.e. every BN was folded); each --meta key=value in metadata_props.
3. Numerics: the graph is evaluated by the small numpy evaluator below (float64 arithmetic on
   the float32 constants; Conv, Relu, HardSwish, HardSigmoid, Mul, Add, GlobalAveragePool,
   Flatten, Gemm, Softmax, BatchNormalization, Identity, and the transformer set: Sub, Div,
   MatMul, Erf, Tanh, Sigmoid, Transpose, Reshape, Pad, Gather, LayerNormalization), on the
   reference inputs x1 (batch 1)
   and x3 (batch 3), and compared with torch's outputs ("probs" or "logits" + batch):
   max|onnx - torch| / max|torch| <= tol.
Prints one line per check; exits 1 if any failed.
"""
import argparse
import math
import os
import sys

import numpy as np
import onnx
from onnx import numpy_helper, shape_inference

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from safetensors_io import load  # noqa: E402

EXPORT_OPS = ["Conv", "Relu", "HardSwish", "HardSigmoid", "Mul", "Add", "GlobalAveragePool",
              "Flatten", "Gemm", "Softmax"]


def attrs(node):
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def conv(x, w, b, a):
    """ONNX Conv (2-D, NCHW) by shifted slices: one einsum per kernel tap, all groups at once."""
    group = a.get("group", 1)
    sh, sw = a.get("strides", [1, 1])
    dh, dw = a.get("dilations", [1, 1])
    pt, pl, pb, pr = a.get("pads", [0, 0, 0, 0])
    kh, kw = w.shape[2:]
    if "kernel_shape" in a:
        assert list(a["kernel_shape"]) == [kh, kw], "Conv: kernel_shape differs from the weight"
    n, c, h, wd = x.shape
    o = w.shape[0]
    assert c == w.shape[1] * group, f"Conv: {c} input channels, weight {w.shape}, group {group}"
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    ho = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1
    wo = (wd + pl + pr - dw * (kw - 1) - 1) // sw + 1
    xg = xp.reshape(n, group, c // group, xp.shape[2], xp.shape[3])
    wg = w.reshape(group, o // group, c // group, kh, kw)
    y = np.zeros((n, group, o // group, ho, wo))
    for i in range(kh):
        for j in range(kw):
            patch = xg[:, :, :, i * dh:i * dh + sh * (ho - 1) + 1:sh,
                       j * dw:j * dw + sw * (wo - 1) + 1:sw]
            y += np.einsum("ngchw,goc->ngohw", patch, wg[:, :, :, i, j], optimize=True)
    y = y.reshape(n, o, ho, wo)
    if b is not None:
        y += b.reshape(1, o, 1, 1)
    return y


def softmax(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def evaluate(model, x, dtype=np.float64, extra_ops=None, env=None):
    """Runs the graph on x (numpy) and returns {output name: array}.

    Float values are computed in dtype (integer initializers stay integers). extra_ops maps an
    op type to fn(inputs, attributes) -> array, adding ops or replacing the ones below (the QDQ
    checker adds QuantizeLinear/DequantizeLinear); env, when given, receives every value."""
    g = model.graph
    env = {} if env is None else env
    for t in g.initializer:
        v = numpy_helper.to_array(t)
        env[t.name] = v.astype(dtype) if v.dtype.kind == "f" else v
    env[g.input[0].name] = x.astype(dtype)
    for node in g.node:
        a = attrs(node)
        ins = [env[i] if i else None for i in node.input]
        op = node.op_type
        if extra_ops and op in extra_ops:
            y = extra_ops[op](ins, a)
        elif op == "Conv":
            y = conv(ins[0], ins[1], ins[2] if len(ins) > 2 else None, a)
        elif op == "Relu":
            y = np.maximum(ins[0], 0.0)
        elif op == "HardSigmoid":
            y = np.clip(a.get("alpha", 0.2) * ins[0] + a.get("beta", 0.5), 0.0, 1.0)
        elif op == "HardSwish":
            y = ins[0] * np.clip(ins[0] / 6.0 + 0.5, 0.0, 1.0)
        elif op == "Mul":
            y = ins[0] * ins[1]
        elif op == "Add":
            y = ins[0] + ins[1]
        elif op == "GlobalAveragePool":
            y = ins[0].mean(axis=(2, 3), keepdims=True)
        elif op == "Flatten":
            axis = a.get("axis", 1)
            y = ins[0].reshape(int(np.prod(ins[0].shape[:axis])), -1)
        elif op == "Gemm":
            aa, bb = ins[0], ins[1]
            if a.get("transA", 0):
                aa = aa.T
            if a.get("transB", 0):
                bb = bb.T
            y = a.get("alpha", 1.0) * (aa @ bb)
            if len(ins) > 2:
                y = y + a.get("beta", 1.0) * ins[2]
        elif op == "Softmax":
            y = softmax(ins[0], a.get("axis", -1))
        elif op == "BatchNormalization":
            xx, s, bias, mean, var = ins
            shp = (1, -1) + (1,) * (xx.ndim - 2)
            y = (xx - mean.reshape(shp)) / np.sqrt(var.reshape(shp) + a.get("epsilon", 1e-5))
            y = y * s.reshape(shp) + bias.reshape(shp)
        elif op == "Identity":
            y = ins[0]
        elif op == "Sub":
            y = ins[0] - ins[1]
        elif op == "Div":
            y = ins[0] / ins[1]
        elif op == "MatMul":
            y = np.matmul(ins[0], ins[1])
        elif op == "Erf":
            y = np.vectorize(math.erf)(ins[0]) if ins[0].size else ins[0]
        elif op == "Tanh":
            y = np.tanh(ins[0])
        elif op == "Sigmoid":
            y = 1.0 / (1.0 + np.exp(-ins[0]))
        elif op == "Transpose":
            y = np.transpose(ins[0], a.get("perm"))
        elif op == "Reshape":
            shape = [ins[0].shape[i] if v == 0 else int(v) for i, v in enumerate(ins[1])]
            y = ins[0].reshape(shape)
        elif op == "Pad":
            pads = [int(v) for v in ins[1]]
            r = ins[0].ndim
            y = np.pad(ins[0], [(pads[i], pads[i + r]) for i in range(r)])
        elif op == "Gather":
            y = np.take(ins[0], ins[1], axis=a.get("axis", 0))
        elif op == "LayerNormalization":
            axis = a.get("axis", -1)
            axes = tuple(range(axis % ins[0].ndim, ins[0].ndim))
            mean = ins[0].mean(axis=axes, keepdims=True)
            var = ((ins[0] - mean) ** 2).mean(axis=axes, keepdims=True)
            y = (ins[0] - mean) / np.sqrt(var + a.get("epsilon", 1e-5)) * ins[1]
            if len(ins) > 2 and ins[2] is not None:
                y = y + ins[2]
        else:
            raise NotImplementedError(f"numpy evaluator: op {op} (node {node.name})")
        env[node.output[0]] = y.astype(dtype, copy=False) if y.dtype.kind == "f" else y
    return {o.name: env[o.name] for o in g.output}


def dims(value_info):
    out = []
    for d in value_info.type.tensor_type.shape.dim:
        out.append(d.dim_value if d.HasField("dim_value") else d.dim_param)
    return out


class Checks:
    def __init__(self):
        self.failed = 0

    def __call__(self, ok, what):
        print(("ok: " if ok else "FAIL: ") + what)
        self.failed += 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--ref", required=True)
    ap.add_argument("--output", choices=["probs", "logits"], required=True)
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--meta", nargs="*", default=[])
    ap.add_argument("--ops", default=",".join(EXPORT_OPS))
    args = ap.parse_args()
    check = Checks()

    onnx.checker.check_model(args.model, full_check=True)
    check(True, f"onnx.checker.check_model(full_check=True) accepts {args.model}")
    model = onnx.load(args.model)
    shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    check(True, "strict shape inference")

    opset = {o.domain: o.version for o in model.opset_import}
    check(opset.get("", 0) >= 14, f"default-domain opset {opset.get('', 0)} >= 14")
    allowed = set(args.ops.split(","))
    used = sorted({n.op_type for n in model.graph.node})
    check(set(used) <= allowed, f"ops {used} within {sorted(allowed)}")
    check("BatchNormalization" not in used, "every BatchNormalization folded")
    check(len(model.graph.input) == 1 and len(model.graph.output) == 1, "one input, one output")
    in_dims, out_dims = dims(model.graph.input[0]), dims(model.graph.output[0])
    check(model.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT,
          "input is float")
    check(isinstance(in_dims[0], str) and in_dims[0] != "" and in_dims[1] == 3,
          f"input dims {in_dims}: symbolic batch, 3 channels")
    check(len(out_dims) == 2 and out_dims[0] == in_dims[0] and isinstance(out_dims[1], int),
          f"output dims {out_dims}: [batch, classes]")
    check(model.graph.output[0].name == args.output, f"output named {args.output}")

    meta = {p.key: p.value for p in model.metadata_props}
    for kv in args.meta:
        key, value = kv.split("=", 1)
        check(meta.get(key) == value, f"metadata {key}={meta.get(key)!r} (want {value!r})")

    ref = load(args.ref)
    in_name, out_name = model.graph.input[0].name, model.graph.output[0].name
    for b in ("1", "3"):
        x = ref["x" + b]
        want = ref[args.output + b].astype(np.float64)
        got = evaluate(model, x)[out_name]
        same_shape = got.shape == want.shape
        err = np.abs(got - want).max() / max(np.abs(want).max(), 1e-6) if same_shape else np.inf
        check(same_shape and err <= args.tol,
              f"batch {b}: {in_name} {list(x.shape)} -> {out_name} {list(got.shape)}, "
              f"relative error vs torch {err:.3e} (tolerance {args.tol:g})")
    if check.failed:
        print(f"{check.failed} check(s) failed")
        sys.exit(1)


if __name__ == "__main__":
    main()
