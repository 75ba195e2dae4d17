#!/usr/bin/env python3
"""Rewrites a GGUF file with its q8_0 / q4_0 / q4_1 tensors stored as bf16.

For measurements of mixkv's bf16 weight products on a real model (docs/engine.md, "SmolLM2 in
bf16"): each block-format tensor is decoded to float32 (gguf's own dequantiser) and rounded to
the nearest bf16, ties to even; every other tensor and every metadata key is copied as it is.
Not part of CI. Needs PyPI's gguf (0.17.1) and numpy:

    python -m venv /tmp/gguf-venv && /tmp/gguf-venv/bin/pip install gguf==0.17.1
    /tmp/gguf-venv/bin/python scripts/gguf-to-bf16.py IN.gguf OUT.gguf
"""
import sys

import gguf
import numpy as np

BLOCK_TYPES = (
    gguf.GGMLQuantizationType.Q8_0,
    gguf.GGMLQuantizationType.Q4_0,
    gguf.GGMLQuantizationType.Q4_1,
)


def to_bf16(values: np.ndarray) -> np.ndarray:
    """float32 values as bf16 codes (uint16), rounded to nearest, ties to even."""
    bits = values.astype(np.float32).view(np.uint32)
    rounded = bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
    return (rounded >> np.uint32(16)).astype(np.uint16)


def main() -> int:
    if len(sys.argv) != 3:
        print("usage: gguf-to-bf16.py IN.gguf OUT.gguf", file=sys.stderr)
        return 2
    source, target = sys.argv[1], sys.argv[2]
    reader = gguf.GGUFReader(source)
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    writer = gguf.GGUFWriter(target, arch)
    for field in reader.fields.values():
        # The writer adds the architecture and the GGUF.* entries itself; the file type no
        # longer describes the tensors.
        if field.name in (gguf.Keys.General.ARCHITECTURE, gguf.Keys.General.FILE_TYPE):
            continue
        if field.name.startswith("GGUF."):
            continue
        value_type = field.types[0]
        sub_type = field.types[-1] if value_type == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), value_type, sub_type=sub_type)
    tensors = []
    for t in reader.tensors:
        if t.tensor_type in BLOCK_TYPES:
            codes = to_bf16(gguf.quants.dequantize(t.data, t.tensor_type))
            tensors.append((t.name, codes, gguf.GGMLQuantizationType.BF16))
        else:
            tensors.append((t.name, t.data, t.tensor_type))
    for name, data, tensor_type in tensors:
        writer.add_tensor_info(name, data.shape, data.dtype, data.nbytes, tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for _, data, _ in tensors:
        writer.write_tensor_data(data)
    writer.close()
    print(f"gguf-to-bf16: wrote {target} ({len(tensors)} tensors)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
