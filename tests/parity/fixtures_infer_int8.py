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
"""
import argparse
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from qdq_eval import output_step, run  # noqa: E402
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

    def model(self, output, out_shape):
        graph = helper.make_graph(
            self.nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                              ["N", 3, 12, 12])],
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


if __name__ == "__main__":
    main()
