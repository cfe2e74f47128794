"""Holds dpar's inference of an exported MobileNetV3-small against onnxruntime (CPU provider):
reads the model, the input and dpar's CPU and GPU outputs that test_cuda_infer leaves in
DPAR_INFER_PARITY_DIR, runs the model in onnxruntime and checks both of dpar's outputs against
it (max |a - b| / max |a| <= 1e-4, fp32), one line per comparison. Exit status 1 on a mismatch.

    python3 onnxruntime_parity.py DIR
"""
import os
import sys

import numpy as np
import onnxruntime as ort


def read(path):
    with open(path + ".shape") as f:
        shape = [int(d) for d in f.read().split()]
    return np.fromfile(path, dtype=np.float32).reshape(shape)


def relative_error(want, got):
    return float(np.max(np.abs(want - got)) / max(float(np.max(np.abs(want))), 1e-6))


def main():
    folder = sys.argv[1]
    x = read(os.path.join(folder, "input.f32"))
    session = ort.InferenceSession(os.path.join(folder, "inference.onnx"),
                                   providers=["CPUExecutionProvider"])
    want = session.run(None, {session.get_inputs()[0].name: x})[0]
    failed = False
    for name in ("cpu_output", "gpu_output"):
        got = read(os.path.join(folder, name + ".f32"))
        err = relative_error(want, got)
        ok = got.shape == want.shape and err <= 1e-4
        failed |= not ok
        print("%s: dpar %s vs onnxruntime %s, input %s: max relative error %.3g (limit 1e-4)"
              % ("ok" if ok else "FAIL", name.replace("_output", ""), ort.__version__,
                 "x".join(map(str, x.shape)), err))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
