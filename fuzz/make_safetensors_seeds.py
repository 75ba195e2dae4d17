"""Writes the seed corpus of the safetensors fuzzer (fuzz/safetensors-seeds/): small checkpoints
in each dtype the reader takes (F32, F16, BF16), with metadata, an empty tensor and a drafter's
tensor names. Deterministic; rerun after changing it: python3 fuzz/make_safetensors_seeds.py"""

import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
WIDTH = {"F32": 4, "F16": 2, "BF16": 2}


def encode(dtype, values):
    if dtype == "F32":
        return struct.pack(f"<{len(values)}f", *values)
    if dtype == "F16":
        return struct.pack(f"<{len(values)}e", *values)
    # bfloat16: the high half of the float32 (the values below are exact in bfloat16)
    return b"".join(struct.pack("<f", v)[2:] for v in values)


def checkpoint(tensors, metadata=None):
    """tensors: name -> (dtype, shape, values), laid out in name order."""
    header, data = {}, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name in sorted(tensors):
        dtype, shape, values = tensors[name]
        raw = encode(dtype, values)
        assert len(raw) == WIDTH[dtype] * len(values)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % 8)  # the data starts 8-byte aligned, as writers do
    return struct.pack("<Q", len(text)) + text + data


SEEDS = {
    "dtypes.safetensors": checkpoint({
        "a.weight": ("F32", [2, 3], [1.5, -2.0, 0.25, 3.0, 1e-3, -7.0]),
        "b.bias": ("BF16", [4], [1.0, -0.5, 2.0, 0.0]),
        "c.scale": ("F16", [1, 2], [0.5, -65504.0]),
    }),
    "metadata-empty.safetensors": checkpoint({
        "empty": ("F32", [0, 4], []),
        "one": ("F16", [1], [1.0]),
    }, metadata={"format": "pt"}),
    "drafter.safetensors": checkpoint({
        "fc.weight": ("BF16", [2, 4], [0.5] * 8),
        "midlayer.input_layernorm.weight": ("BF16", [2], [1.0, 1.0]),
        "norm.weight": ("F32", [2], [1.0, 0.5]),
    }),
}

if __name__ == "__main__":
    out = os.path.join(HERE, "safetensors-seeds")
    os.makedirs(out, exist_ok=True)
    for name, blob in SEEDS.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(blob)
        print(f"{name}: {len(blob)} bytes")
