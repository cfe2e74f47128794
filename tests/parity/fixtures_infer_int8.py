"""Hand-made ONNX QDQ (int8) models for dpar::infer's int8 path (test_infer_int8.cpp), built
with onnx.helper, and their reference outputs from qdq_eval.py (ONNX QuantizeLinear /
DequantizeLinear semantics, torch conv2d on the dequantized values).

Usage: /usr/bin/python3 tests/parity/fixtures_infer_int8.py --seed 0 --out DIR

Files written to DIR/infer_int8/:
  small.onnx            x[N,3,12,12] -> Q(int8) -> Conv 3x3 (per-channel int8 weights, bias)
                        -> Relu -> Q(uint8) -> depthwise Conv 3x3 stride 2 -> HardSwish
                        -> Q(int8) -> Conv 1x1 -> HardSwish -> Q(int8) -> Conv 1x1
                        -> Add (the HardSwish output before) -> Relu
                        -> GlobalAveragePool -> Flatten -> Q(uint8) -> Gemm (transB=1) logits
  small.safetensors     x [4,3,12,12] ~ N(0,1); y: the reference logits; step: one
                        quantisation step of the output (qdq_eval.output_step)
  unsupported.onnx      Conv -> QuantizeLinear -> DequantizeLinear -> Sigmoid 'sig': a QDQ
                        pair around an op dpar has no int8 kernel for
  zero_point.onnx       small.onnx's first QuantizeLinear/DequantizeLinear with zero point 3
  full_range_<case>.onnx  x -> Q -> one Conv or Gemm (int8 weights of +-127 in output channels
                        0-2, scale 0.01) -> y: inputs and weights at the ends of their ranges,
                        where 16-bit sums of u8 x s8 product pairs (int8 without VNNI) saturate.
                        Cases: gemm_s8 (x[N,64], Q int8), gemm_u8 (Q uint8), conv3x3_u8
                        (x[N,8,5,5], pads 1, 6 outputs), depthwise_u8 (8 groups of one channel)
  full_range_<case>.safetensors  x [4,...] (all at the top of the range, the bottom, alternating,
                        uniform); y: the reference; halved_bound (y's shape): the error halving
                        the weights allows each output, s_w * (sum of |x_dq| over its inputs)
"""
import argparse
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from qdq_eval import conv, output_step, run  # noqa: E402
from safetensors_io import save  # noqa: E402


class Builder:
    def __init__(self, rng):
        self.rng, self.nodes, self.inits = rng, [], []

    def const(self, name, value):
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(self, op, inputs, name, **kw):
        self.nodes.append(helper.make_node(op, inputs, [name], name=name, **kw))
        return name

    def qdq(self, x, scale, unsigned, zero_point=0):
        dt = np.uint8 if unsigned else np.int8
        s = self.const(x + ".scale", np.float32(scale))
        z = self.const(x + ".zp", dt(zero_point))
        q = self.node("QuantizeLinear", [x, s, z], x + "/Q")
        return self.node("DequantizeLinear", [q, s, z], x + "/DQ")

    def weight(self, name, shape):
        w = self.rng.normal(0, 0.5, shape).astype(np.float32)
        s = (np.abs(w.reshape(shape[0], -1)).max(1) / 127).astype(np.float32)
        q = np.clip(np.rint(w / s.reshape([-1] + [1] * (len(shape) - 1))), -127, 127)
        wq = self.const(name + "_q", q.astype(np.int8))
        ws = self.const(name + "_scale", s)
        wz = self.const(name + "_zp", np.zeros(shape[0], np.int8))
        return self.node("DequantizeLinear", [wq, ws, wz], name + "/DQ", axis=0)

    def model(self, output, out_shape, in_shape=("N", 3, 12, 12)):
        graph = helper.make_graph(
            self.nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                              list(in_shape))],
            [helper.make_tensor_value_info(output, TensorProto.FLOAT, out_shape)], self.inits)
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
        m.ir_version = 7
        onnx.checker.check_model(m, full_check=True)
        return m


def small(rng, zero_point=0):
    b = Builder(rng)
    bias = lambda name, n: b.const(name, rng.normal(0, 0.2, n).astype(np.float32))  # noqa: E731
    x = b.qdq("x", 3.0 / 127, False, zero_point)
    c1 = b.node("Conv", [x, b.weight("c1.w", (8, 3, 3, 3)), bias("c1.b", 8)], "c1",
                pads=[1, 1, 1, 1])
    r1 = b.node("Relu", [c1], "r1")
    dw = b.node("Conv", [b.qdq(r1, 4.0 / 255, True), b.weight("dw.w", (8, 1, 3, 3)),
                         bias("dw.b", 8)], "dw", group=8, strides=[2, 2], pads=[1, 1, 1, 1])
    hs = b.node("HardSwish", [dw], "hs")
    pw = b.node("Conv", [b.qdq(hs, 3.0 / 127, False), b.weight("pw.w", (8, 8, 1, 1)),
                         bias("pw.b", 8)], "pw")
    hs2 = b.node("HardSwish", [pw], "hs2")
    pw2 = b.node("Conv", [b.qdq(hs2, 4.0 / 127, False), b.weight("pw2.w", (8, 8, 1, 1)),
                          bias("pw2.b", 8)], "pw2")
    add = b.node("Add", [pw2, hs], "add")
    r2 = b.node("Relu", [add], "r2")
    pool = b.node("GlobalAveragePool", [r2], "pool")
    flat = b.node("Flatten", [pool], "flat", axis=1)
    b.node("Gemm", [b.qdq(flat, 2.0 / 255, True), b.weight("fc.w", (5, 8)), bias("fc.b", 5)],
           "logits", transB=1)
    return b.model("logits", ["N", 5])


def unsupported(rng):
    b = Builder(rng)
    c = b.node("Conv", ["x", b.const("w", rng.normal(0, 0.5, (4, 3, 1, 1)).astype(np.float32))],
               "conv")
    b.node("Sigmoid", [b.qdq(c, 0.05, False)], "sig")
    return b.model("sig", ["N", 4, 12, 12])


FULL_RANGE = {  # case: (input shape of one image, unsigned, Conv attributes or None for Gemm)
    "gemm_s8": ((64,), False, None),
    "gemm_u8": ((64,), True, None),
    "conv3x3_u8": ((8, 5, 5), True, {"pads": [1, 1, 1, 1]}),
    "depthwise_u8": ((8, 5, 5), True, {"pads": [1, 1, 1, 1], "group": 8}),
}


def full_range(rng, case):
    """The model of one case, its input (4 images) and the halved-weights error bound."""
    shape, unsigned, attrs = FULL_RANGE[case]
    b = Builder(rng)
    o = 6 if attrs is None or "group" not in attrs else shape[0]
    w_shape = (o, shape[0]) if attrs is None else (o, shape[0] // attrs.get("group", 1), 3, 3)
    wq = rng.integers(-127, 128, w_shape)
    wq[0], wq[1] = 127, -127
    wq[2] = np.where(np.arange(wq[2].size).reshape(wq[2].shape) % 2 == 0, 127, -127)
    w = b.node("DequantizeLinear", [b.const("w_q", wq.astype(np.int8)),
                                    b.const("w_scale", np.full(o, 0.01, np.float32)),
                                    b.const("w_zp", np.zeros(o, np.int8))], "w/DQ", axis=0)
    s_x = 1.0 / (255 if unsigned else 127)
    inputs = [b.qdq("x", s_x, unsigned), w, b.const("b", rng.normal(0, 0.2, o).astype(np.float32))]
    if attrs is None:
        b.node("Gemm", inputs, "y", transB=1)
        out_shape = ["N", o]
    else:
        b.node("Conv", inputs, "y", **attrs)
        out_shape = ["N", o] + list(shape[1:])
    m = b.model("y", out_shape, in_shape=("N",) + shape)
    low = 0.0 if unsigned else -1.0
    n = int(np.prod(shape))
    x = np.stack([np.ones(n), np.full(n, low), np.where(np.arange(n) % 2 == 0, 1.0, low),
                  rng.uniform(low, 1, n)]).reshape((4,) + shape).astype(np.float32)
    y, env = run(m, x)
    # Halving moves each weight by at most one step (0.01): the error of an output is at most
    # 0.01 times the sum of its dequantized inputs' magnitudes. Per output element, so that an
    # all-zero input's outputs (the bias alone) must come out exact.
    x_dq = np.abs(env["x/DQ"]).astype(np.float32)
    ones = np.full(w_shape, 0.01, np.float32)
    bound = x_dq @ ones.T if attrs is None else conv(x_dq, ones, None, attrs)
    return m, x, y, bound.astype(np.float32)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    out = os.path.join(a.out, "infer_int8")
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(a.seed)
    m = small(rng)
    onnx.save(m, os.path.join(out, "small.onnx"))
    x = rng.normal(0, 1, (4, 3, 12, 12)).astype(np.float32)
    y, env = run(m, x)
    save(os.path.join(out, "small.safetensors"),
         {"x": x, "y": y, "step": np.float32([output_step(m, env)])})
    onnx.save(unsupported(np.random.default_rng(a.seed)), os.path.join(out, "unsupported.onnx"))
    onnx.save(small(np.random.default_rng(a.seed), zero_point=3),
              os.path.join(out, "zero_point.onnx"))

    for case in FULL_RANGE:
        m, x, y, bound = full_range(rng, case)
        onnx.save(m, os.path.join(out, f"full_range_{case}.onnx"))
        save(os.path.join(out, f"full_range_{case}.safetensors"),
             {"x": x, "y": y, "halved_bound": bound})


if __name__ == "__main__":
    main()
