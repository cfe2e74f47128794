// onnxruntime peer for bench_infer: runs an ONNX file (dpar's export, fp32 or its int8 QDQ
// form) on onnxruntime's CPU execution provider, from the npm package onnxruntime-node (the
// onnxruntime C library ships inside it; scripts/bootstrap.sh installs it).
//
// Settings are onnxruntime's documented fastest for one request at a time: every graph
// optimisation, sequential execution, --threads intra-op threads, one inter-op thread.
//
// Before timing, the output for --input (raw little-endian f32, shape --shape) is compared with
// --expected (dpar::infer's output for the same input): "max_abs_diff" and "max_abs_expected".
// Prints one JSON line: {"ms": median ms per run, "max_abs_diff", "max_abs_expected",
// "ort": version, "threads"}.
//
// --profile-prefix P: afterwards, a second session with onnxruntime's profiler on (its trace
// is written to P_<date>.json and removed after reading) runs the same warm-up and timed runs;
// "profile" then maps each kind of node to its mean ms per timed run, under the names
// dpar::infer's profile uses (conv_category in lib/src/infer/plan_build.cpp): "conv 1x1",
// "conv depthwise 3x3", "conv 1x1 on 1x1 maps", "reorder", ... The profiler's own cost stays
// out of "ms".
"use strict";
const fs = require("fs");
const path = require("path");

let ort;  // the onnxruntime-node module, loaded from --ort-dir

function parseArgs(argv) {
  const args = {threads: 1, warmup: 3, iters: 20};
  for (let i = 0; i < argv.length; i += 2) {
    const key = argv[i].replace(/^--/, "");
    if (i + 1 >= argv.length) throw new Error(`ort_infer: ${argv[i]} needs a value`);
    args[key] = argv[i + 1];
  }
  for (const key of ["model", "input", "shape", "ort-dir"]) {
    if (args[key] === undefined) throw new Error(`ort_infer: --${key} is required`);
  }
  return args;
}

// The profile name of one onnxruntime node, from its op type and input shapes.
function nodeCategory(op, inputs) {
  const int8 = op === "QLinearConv" || op === "ConvInteger";
  if (["Conv", "FusedConv", "NchwcConv"].includes(op) || int8) {
    const x = inputs[0];
    const w = inputs[op === "QLinearConv" ? 3 : 1];
    const suffix = int8 ? " int8" : "";
    // onnxruntime's NHWC QLinearConv lists its weights prepacked: no kernel shape to read.
    if (!w || w.length !== 4) return `conv${suffix}, weights prepacked (any kernel)`;
    const kernel = `${w[2]}x${w[3]}`;
    if (w[1] === 1 && x[1] > 1) return `conv depthwise ${kernel}${suffix}`;
    if (x[2] === 1 && x[3] === 1) return `conv ${kernel} on 1x1 maps${suffix}`;
    return `conv ${kernel}${suffix}`;
  }
  const kinds = {
    inner_product: ["Gemm", "MatMul", "FusedGemm", "FusedMatMul"],
    "inner_product int8": ["QGemm", "MatMulInteger", "QLinearMatMul", "DynamicQuantizeMatMul"],
    pooling: ["GlobalAveragePool", "AveragePool", "MaxPool", "QLinearGlobalAveragePool"],
    binary: ["Mul", "Add", "Sub", "Div", "QLinearAdd", "QLinearMul"],
    reorder: ["ReorderInput", "ReorderOutput", "Transpose"],
    quantize: ["QuantizeLinear"],
    dequantize: ["DequantizeLinear"],
    eltwise: ["Relu", "HardSigmoid", "HardSwish", "Sigmoid", "Clip", "Tanh", "Erf", "Gelu"],
    view: ["Flatten", "Reshape", "Squeeze", "Unsqueeze"],
    softmax: ["Softmax"],
  };
  for (const [name, ops] of Object.entries(kinds)) {
    if (ops.includes(op)) return name;
  }
  return op;
}

// Mean ms per run of each node kind over the last `runs` runs of a profiler trace.
function profileByCategory(traceFile, runs) {
  const events = JSON.parse(fs.readFileSync(traceFile, "utf8"));
  const byNode = new Map();
  for (const e of events) {
    if (e.cat !== "Node" || !e.name.endsWith("_kernel_time")) continue;
    if (!byNode.has(e.name)) {
      const inputs = (e.args.input_type_shape || []).map((t) => Object.values(t)[0]);
      byNode.set(e.name, {category: nodeCategory(e.args.op_name, inputs), us: []});
    }
    byNode.get(e.name).us.push(e.dur);
  }
  const out = {};
  for (const node of byNode.values()) {
    const last = node.us.slice(-runs);
    const ms = last.reduce((a, b) => a + b, 0) / 1000 / runs;
    out[node.category] = (out[node.category] || 0) + ms;
  }
  return out;
}

async function profileRuns(a, sessionOptions, feeds) {
  const prefix = a["profile-prefix"];
  const session = await ort.InferenceSession.create(a.model, {
    ...sessionOptions,
    enableProfiling: true,
    profileFilePrefix: prefix,
  });
  const runs = Number(a.iters);
  for (let i = 0; i < Number(a.warmup) + runs; ++i) await session.run(feeds);
  session.endProfiling();
  const dir = path.dirname(prefix);
  const traces = fs
    .readdirSync(dir)
    .filter((f) => f.startsWith(path.basename(prefix)) && f.endsWith(".json"))
    .map((f) => path.join(dir, f));
  if (traces.length !== 1) {
    throw new Error(`ort_infer: expected one profiler trace ${prefix}_*.json, found ${traces.length}`);
  }
  const profile = profileByCategory(traces[0], runs);
  fs.unlinkSync(traces[0]);
  return profile;
}

function readFloats(file) {
  const bytes = fs.readFileSync(file);
  return new Float32Array(bytes.buffer, bytes.byteOffset, bytes.length / 4);
}

async function main() {
  const a = parseArgs(process.argv.slice(2));
  const packageDir = path.join(a["ort-dir"], "node_modules", "onnxruntime-node");
  ort = require(packageDir);
  const version = JSON.parse(fs.readFileSync(path.join(packageDir, "package.json"))).version;
  const threads = Number(a.threads);
  const sessionOptions = {
    executionProviders: ["cpu"],
    graphOptimizationLevel: "all",
    executionMode: "sequential",
    intraOpNumThreads: threads,
    interOpNumThreads: 1,
  };
  const session = await ort.InferenceSession.create(a.model, sessionOptions);
  const shape = a.shape.split(",").map(Number);
  const feeds = {[session.inputNames[0]]: new ort.Tensor("float32", readFloats(a.input), shape)};
  const outputName = session.outputNames[0];

  const out = {ort: version, threads};
  if (a.expected !== undefined) {
    const got = (await session.run(feeds))[outputName].data;
    const want = readFloats(a.expected);
    if (got.length !== want.length) {
      throw new Error(`ort_infer: output has ${got.length} values, dpar's ${want.length}`);
    }
    let diff = 0;
    let scale = 0;
    for (let i = 0; i < got.length; ++i) {
      diff = Math.max(diff, Math.abs(got[i] - want[i]));
      scale = Math.max(scale, Math.abs(want[i]));
    }
    out.max_abs_diff = diff;
    out.max_abs_expected = scale;
  }

  // Median of per-run times, as bench_infer times dpar: robust to a moment of other load.
  for (let i = 0; i < Number(a.warmup); ++i) await session.run(feeds);
  const ms = [];
  for (let i = 0; i < Number(a.iters); ++i) {
    const t0 = process.hrtime.bigint();
    await session.run(feeds);
    ms.push(Number(process.hrtime.bigint() - t0) / 1e6);
  }
  ms.sort((x, y) => x - y);
  out.ms = ms[Math.floor(ms.length / 2)];
  if (a["profile-prefix"] !== undefined) out.profile = await profileRuns(a, sessionOptions, feeds);
  console.log(JSON.stringify(out));
}

main().catch((e) => {
  console.error(`ort_infer: ${e.message}`);
  process.exit(1);
});
