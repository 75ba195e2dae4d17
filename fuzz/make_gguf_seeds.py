"""Writes the seed corpus of the GGUF fuzzer (fuzz/gguf-seeds/): small GGUF files with llama
keys, a byte-level BPE vocabulary and tensors of each type the reader decodes. Deterministic;
rerun after changing it: python3 fuzz/make_gguf_seeds.py"""

import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def s(text):
    b = text.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def kv(key, vtype, payload):
    return s(key) + struct.pack("<I", vtype) + payload


def byte_chars():
    keep = [b for b in range(256) if 0x21 <= b <= 0x7E or 0xA1 <= b <= 0xAC or b >= 0xAE]
    out, n = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + n)
            n += 1
    return [out[b] for b in range(256)]


def gguf(kvs, tensors, version=3, alignment=32):
    infos, data = b"", b""
    for name, ne, ttype, blob in tensors:
        data += b"\0" * (-len(data) % alignment)
        infos += s(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne)
        infos += struct.pack("<IQ", ttype, len(data))
        data += blob
    head = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs)) + b"".join(kvs) + infos
    return head + b"\0" * (-len(head) % alignment) + data


def main():
    chars = byte_chars()
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + chars + ["\u0120t", "he", "\u0120the"]
    types = [3, 3, 3] + [1] * (len(tokens) - 3)
    merges = ["\u0120 t", "h e", "\u0120t he"]
    kvs = [
        kv("general.architecture", 8, s("llama")),
        kv("llama.block_count", 4, struct.pack("<I", 1)),
        kv("llama.context_length", 4, struct.pack("<I", 256)),
        kv("llama.embedding_length", 4, struct.pack("<I", 32)),
        kv("llama.feed_forward_length", 4, struct.pack("<I", 64)),
        kv("llama.attention.head_count", 4, struct.pack("<I", 2)),
        kv("llama.attention.head_count_kv", 4, struct.pack("<I", 1)),
        kv("llama.rope.freq_base", 6, struct.pack("<f", 10000.0)),
        kv("llama.attention.layer_norm_rms_epsilon", 6, struct.pack("<f", 1e-5)),
        kv("tokenizer.ggml.model", 8, s("gpt2")),
        kv("tokenizer.ggml.pre", 8, s("smollm")),
        kv("tokenizer.ggml.tokens", 9, struct.pack("<IQ", 8, len(tokens)) + b"".join(map(s, tokens))),
        kv("tokenizer.ggml.token_type", 9,
           struct.pack("<IQ", 5, len(types)) + b"".join(struct.pack("<i", t) for t in types)),
        kv("tokenizer.ggml.merges", 9, struct.pack("<IQ", 8, len(merges)) + b"".join(map(s, merges))),
        kv("tokenizer.ggml.bos_token_id", 4, struct.pack("<I", 1)),
        kv("tokenizer.ggml.eos_token_id", 4, struct.pack("<I", 2)),
        kv("tokenizer.ggml.add_bos_token", 7, b"\0"),
    ]
    half = struct.pack("<e", 0.5)
    tensors = [
        ("f32", [4, 2], 0, struct.pack("<8f", *range(8))),
        ("f16", [4], 1, struct.pack("<4e", 1, -2, 0.5, 3)),
        ("q4_0", [32], 2, half + bytes(range(16))),
        ("q4_1", [32], 3, half + struct.pack("<e", -1.0) + bytes(range(16, 32))),
        ("q8_0", [32, 2], 8, (half + bytes(range(32))) * 2),
        ("bf16", [2], 30, struct.pack("<2H", 0x3F80, 0xC040)),
    ]
    os.makedirs(os.path.join(HERE, "gguf-seeds"), exist_ok=True)
    with open(os.path.join(HERE, "gguf-seeds", "tiny-llama.gguf"), "wb") as f:
        f.write(gguf(kvs, tensors))
    with open(os.path.join(HERE, "gguf-seeds", "v2-aligned64.gguf"), "wb") as f:
        f.write(gguf([kv("general.alignment", 4, struct.pack("<I", 64))] + kvs[:3], tensors[:2],
                     version=2, alignment=64))


if __name__ == "__main__":
    main()
