"""ONNX models and PyTorch eval outputs for the inference runtime (test_infer_parity.cpp).

Usage: /usr/bin/python3 tests/parity/fixtures_infer.py --seed 0 --out DIR

Models come from torch.onnx.export (opset 14, dynamic batch) of eval-mode modules whose
BatchNorm statistics, affine parameters and biases are redrawn off their init values (at init
BN folding would be the identity and prove nothing). Files written to DIR/infer/:

  mobilenet_v3_small.onnx      torchvision mobilenet_v3_small(1000), exported as torch does by
                               default (BatchNorm folded by the exporter, Identity nodes on
                               deduplicated biases), plus metadata_props: model_name,
                               input_size, mean, std, class_names (JSON array)
  mobilenet_v3_small_bn.onnx   the same weights exported with TrainingMode.PRESERVE, which
                               keeps 34 BatchNormalization nodes for the runtime to fold, with
                               Softmax appended (outputs probabilities); no metadata
  ops.onnx / ops_opset12.onnx  a small CNN touching every supported op and fusion pattern
                               (see OpsNet); at opset 12 HardSwish is exported as
                               HardSigmoid + Mul and Softmax with the pre-13 semantics
  unsupported.onnx             valid graph with LSTM 'lstm_1', Resize 'up' and
                               com.microsoft FusedConv 'fc' nodes (built with onnx.helper)
  missing_init.onnx            a Conv whose weight 'w_missing' is no initializer
  dangling_output.onnx         a MatMul graph whose declared output no node produces
  short_inputs.onnx            a LayerNormalization node without its required scale input
  no_output.onnx               a Relu node 'lost' that lists no output, before the Relu that
                               writes the graph output
  bad_shape.onnx               input [N,3,8,8] into a Conv 'conv' with weight [4,5,1,1]
  dropout.onnx                 input [N,4] -> Dropout (ratio and training_mode=False as
                               initializers) -> Identity -> Relu: inference computes relu(x)
  mobilenet.safetensors        x1 [1,3,224,224], x4 [4,3,224,224] ~ N(0,1); logits1, logits4;
                               probs1, probs4 (softmax of the logits)
  ops.safetensors              x [2,3,20,24]; y (OpsNet output at opset 14), y12 (same)
"""
import argparse
import json
import os
import sys

import onnx
import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision
from onnx import TensorProto, helper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from safetensors_io import save  # noqa: E402


def perturb(model):
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.BatchNorm2d, nn.BatchNorm1d)):
                m.weight.uniform_(0.5, 1.5)
                m.bias.normal_(0.0, 0.1)
                m.running_mean.normal_(0.0, 0.1)
                m.running_var.uniform_(0.5, 1.5)
            elif isinstance(m, (nn.Conv2d, nn.Linear)) and m.bias is not None:
                m.bias.normal_(0.0, 0.05)


class OpsNet(nn.Module):
    """Every op and fusion the runtime handles, on a [N,3,H,W] input:
    conv+bias+LeakyReLU; grouped dilated strided conv + ReLU6 (Clip); two convs of one input
    whose sum is fused into the later one, then ReLU after the sum; a standalone BatchNorm (after
    an Add, so not foldable) then Tanh; Mul by a constant [C,1,1]; Sigmoid; an SE block
    (GlobalAveragePool, 1x1 convs, Hardsigmoid, Mul); a conv with a residual Add before the
    activation; GlobalAveragePool, Flatten, Linear (Gemm transB=1) + Hardswish, addmm (Gemm with
    alpha, beta, transB=0), Softmax."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 16, 3, padding=1)
        self.c2 = nn.Conv2d(16, 16, 3, stride=2, padding=2, dilation=2, groups=4, bias=False)
        self.bn2 = nn.BatchNorm2d(16)
        self.a = nn.Conv2d(16, 16, 1)
        self.b = nn.Conv2d(16, 16, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(16)
        self.register_buffer("scale", torch.linspace(0.5, 1.5, 16).reshape(16, 1, 1))
        self.se1 = nn.Conv2d(16, 8, 1)
        self.se2 = nn.Conv2d(8, 16, 1)
        self.res = nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.bn_res = nn.BatchNorm2d(16)
        self.fc1 = nn.Linear(16, 32)
        self.w2 = nn.Parameter(torch.randn(32, 10) * 0.2)
        self.c = nn.Parameter(torch.randn(10) * 0.1)

    def forward(self, x):
        x = F.leaky_relu(self.c1(x), 0.1)
        x = F.relu6(self.bn2(self.c2(x)))
        x = F.relu(self.a(x) + self.b(x))
        x = torch.tanh(self.bn(x + x * 0.0 + x))
        x = torch.sigmoid(x * self.scale)
        s = F.hardsigmoid(self.se2(F.relu(self.se1(F.adaptive_avg_pool2d(x, 1)))))
        x = x * s
        x = F.hardswish(self.bn_res(self.res(x)) + x)
        h = torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)
        h = F.hardswish(self.fc1(h))
        h = torch.addmm(self.c, h, self.w2, beta=0.5, alpha=2.0)
        return F.softmax(h, dim=1)


def export(model, x, path, opset=14, **kw):
    torch.onnx.export(model, x, path, opset_version=opset, input_names=["input"],
                      output_names=["output"],
                      dynamic_axes={"input": {0: "N"}, "output": {0: "N"}}, **kw)


def add_metadata(path, props):
    model = onnx.load(path)
    for k, v in props.items():
        entry = model.metadata_props.add()
        entry.key, entry.value = k, v
    onnx.save(model, path)


def bad_models(out):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 3, 1, 1], [0.5] * 12)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
        helper.make_node("Resize", ["c", "", "scales"], ["r"], name="up"),
        helper.make_node("Relu", ["r"], ["h"], name="relu"),
        helper.make_node("LSTM", ["h", "w", "w"], ["l"], name="lstm_1", hidden_size=4),
        helper.make_node("FusedConv", ["l", "w"], ["y"], name="fc", domain="com.microsoft"),
    ]
    scales = helper.make_tensor("scales", TensorProto.FLOAT, [4], [1, 1, 2, 2])
    graph = helper.make_graph(nodes, "bad", [x], [y], [w, scales])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14),
                                                    helper.make_opsetid("com.microsoft", 1)])
    onnx.save(model, os.path.join(out, "unsupported.onnx"))

    nodes = [helper.make_node("Conv", ["x", "w_missing"], ["c"], name="conv1"),
             helper.make_node("Relu", ["c"], ["y"], name="relu1")]
    graph = helper.make_graph(nodes, "missing", [x], [y], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    onnx.save(model, os.path.join(out, "missing_init.onnx"))

    # A graph for the node-by-node path (MatMul) whose declared output no node produces: the
    # interpreter used to look the output up with map::at (found by fuzz_onnx_model).
    m = helper.make_tensor("m", TensorProto.FLOAT, [8, 2], [0.25] * 16)
    nodes = [helper.make_node("MatMul", ["x", "m"], ["z"], name="mm")]
    graph = helper.make_graph(nodes, "dangling", [x], [y], [m])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    onnx.save(model, os.path.join(out, "dangling_output.onnx"))

    # A LayerNormalization node that lists only its data input (the scale is required): the
    # interpreter indexed the missing input (found by fuzz_onnx_model).
    nodes = [helper.make_node("MatMul", ["x", "m"], ["z"], name="mm"),
             helper.make_node("LayerNormalization", ["z"], ["y"], name="ln", axis=-1)]
    graph = helper.make_graph(nodes, "short_inputs", [x], [y], [m])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, os.path.join(out, "short_inputs.onnx"))

    # A node without outputs: the planned runtime indexed its first output with vector::at
    # (found by fuzz_onnx_model).
    nodes = [helper.make_node("Relu", ["x"], [], name="lost"),
             helper.make_node("Relu", ["x"], ["y"], name="relu")]
    graph = helper.make_graph(nodes, "no_output", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    onnx.save(model, os.path.join(out, "no_output.onnx"))

    w5 = helper.make_tensor("w5", TensorProto.FLOAT, [4, 5, 1, 1], [0.5] * 20)
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w5"], ["y"], name="conv")],
                              "bad_shape", [x], [y], [w5])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    onnx.save(model, os.path.join(out, "bad_shape.onnx"))

    x2 = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])
    nodes = [helper.make_node("Dropout", ["x", "ratio", "train"], ["d"], name="drop"),
             helper.make_node("Identity", ["d"], ["i"], name="id"),
             helper.make_node("Relu", ["i"], ["y"], name="relu")]
    inits = [helper.make_tensor("ratio", TensorProto.FLOAT, [], [0.5]),
             helper.make_tensor("train", TensorProto.BOOL, [], [False])]
    y2 = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])
    graph = helper.make_graph(nodes, "dropout", [x2], [y2], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    onnx.checker.check_model(model)
    onnx.save(model, os.path.join(out, "dropout.onnx"))

    # Concat (a torch.cat in an exported model): along the last axis, then a constant row
    # appended along the batch axis - the node-by-node path runs it.
    x3 = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Concat", ["x", "r"], ["c"], name="cat_features", axis=-1),
             helper.make_node("Concat", ["c", "row"], ["y"], name="cat_rows", axis=0)]
    inits = [helper.make_tensor("row", TensorProto.FLOAT, [1, 8], [9.0] * 8)]
    y3 = helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 8])
    graph = helper.make_graph(nodes, "concat", [x3], [y3], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    onnx.checker.check_model(model)
    onnx.save(model, os.path.join(out, "concat.onnx"))
    graph = helper.make_graph([helper.make_node("Concat", ["x", "x"], ["y"], name="cat", axis=2)],
                              "concat_bad_axis", [x3], [y3])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    onnx.save(model, os.path.join(out, "concat_bad_axis.onnx"))
    graph = helper.make_graph([helper.make_node("Concat", ["x", "x"], ["y"], name="cat")],
                              "concat_no_axis", [x3], [y3])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    onnx.save(model, os.path.join(out, "concat_no_axis.onnx"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    out = os.path.join(args.out, "infer")
    os.makedirs(out, exist_ok=True)
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)

    model = torchvision.models.mobilenet_v3_small().eval()
    perturb(model)
    x1, x4 = torch.randn(1, 3, 224, 224), torch.randn(4, 3, 224, 224)
    path = os.path.join(out, "mobilenet_v3_small.onnx")
    export(model, x1, path)
    add_metadata(path, {"model_name": "mobilenet_v3_small", "input_size": "224",
                        "mean": "0.485,0.456,0.406", "std": "0.229,0.224,0.225",
                        "class_names": json.dumps([f"class_{i}" for i in range(1000)])})
    export(nn.Sequential(model, nn.Softmax(dim=1)).eval(), x1,
           os.path.join(out, "mobilenet_v3_small_bn.onnx"),
           training=torch.onnx.TrainingMode.PRESERVE)
    with torch.no_grad():
        l1, l4 = model(x1), model(x4)
    save(os.path.join(out, "mobilenet.safetensors"),
         {"x1": x1, "x4": x4, "logits1": l1, "logits4": l4, "probs1": F.softmax(l1, 1),
          "probs4": F.softmax(l4, 1)})

    ops = OpsNet().eval()
    perturb(ops)
    x = torch.randn(2, 3, 20, 24)
    export(ops, x, os.path.join(out, "ops.onnx"))
    export(ops, x, os.path.join(out, "ops_opset12.onnx"), opset=12)
    with torch.no_grad():
        y = ops(x)
    save(os.path.join(out, "ops.safetensors"), {"x": x, "y": y})

    bad_models(out)
    print(f"fixtures_infer: wrote {out}")


if __name__ == "__main__":
    main()
