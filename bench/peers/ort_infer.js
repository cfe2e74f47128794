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
"use strict";
const fs = require("fs");
const path = require("path");

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

function readFloats(file) {
  const bytes = fs.readFileSync(file);
  return new Float32Array(bytes.buffer, bytes.byteOffset, bytes.length / 4);
}

async function main() {
  const a = parseArgs(process.argv.slice(2));
  const packageDir = path.join(a["ort-dir"], "node_modules", "onnxruntime-node");
  const ort = require(packageDir);
  const version = JSON.parse(fs.readFileSync(path.join(packageDir, "package.json"))).version;
  const threads = Number(a.threads);
  const session = await ort.InferenceSession.create(a.model, {
    executionProviders: ["cpu"],
    graphOptimizationLevel: "all",
    executionMode: "sequential",
    intraOpNumThreads: threads,
    interOpNumThreads: 1,
  });
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
  console.log(JSON.stringify(out));
}

main().catch((e) => {
  console.error(`ort_infer: ${e.message}`);
  process.exit(1);
});
