"""Minimal .safetensors reader/writer for the parity fixture scripts.

Debian ships no `safetensors` module for python3-torch 1.13, and the format is small:
8-byte little-endian header length, a JSON header {name: {dtype, shape, data_offsets}},
then the raw little-endian tensor bytes.
"""
import json
import struct

import numpy as np

_DTYPES = {np.dtype("float32"): "F32", np.dtype("int64"): "I64", np.dtype("uint8"): "U8",
           np.dtype("float16"): "F16"}
_NP = {v: k for k, v in _DTYPES.items()}


def save(path, tensors, metadata=None):
    """tensors: dict name -> numpy array or torch tensor (kept in insertion order)."""
    header, blobs, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name, value in tensors.items():
        if hasattr(value, "detach"):
            value = value.detach().cpu().contiguous().numpy()
        # ascontiguousarray makes 0-d arrays 1-d; keep scalars (losses, counters) shape [].
        arr = np.ascontiguousarray(value).reshape(np.shape(value))
        data = arr.tobytes()
        header[name] = {"dtype": _DTYPES[arr.dtype], "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * ((8 - len(raw) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for b in blobs:
            f.write(b)


def load(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        out[name] = np.frombuffer(data[b:e], dtype=_NP[info["dtype"]]).reshape(info["shape"])
    return out
