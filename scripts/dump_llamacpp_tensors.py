"""Dumps llama.cpp's intermediate tensors of one layer, one token per llama_decode call (its
decode path), into a NumPy .npz: for comparing mixkv's steps with llama.cpp's bit for bit
(docs/engine.md, "Agreement with llama.cpp"). Needs a virtual environment with llama-cpp-python
(scripts/llamacpp-venv.sh makes one); not run by CI.

  python scripts/dump_llamacpp_tensors.py --model M.gguf --tokens 1,9690,198 --out t.npz
  python scripts/dump_llamacpp_tensors.py --model M.gguf \\
      --reference tests/tokenizer/data/smollm2-llamacpp-reference.json --chat 0 --count 100 ...

Keys are "p<position>|<tensor name>|op<ggml op id>[|<repeat>]" with arrays shaped
[ne3, ne2, ne1, ne0]; llama.cpp names a layer's tensors "<name>-<layer>" (attn_norm-0, Qcur-0
after the projection and again after RoPE, Kcur-0, Vcur-0, kqv_out-0, ffn_gate-0, ffn_up-0,
ffn_swiglu-0, ffn_out-0, l_out-0) and the head's result_norm / result_output. Only contiguous f32
and f16 tensors are kept. A native llama.cpp build (AVX-512 VNNI, AMX) computes the block-format
products differently from the recording build; its attention, RoPE and SiLU are the same code.
"""

import argparse
import ctypes
import json

import llama_cpp as L
import numpy as np


class GgmlTensor(ctypes.Structure):
    # struct ggml_tensor of the ggml llama-cpp-python 0.3.16 vendors (ggml.h): GGML_MAX_DIMS 4,
    # GGML_MAX_OP_PARAMS 64 bytes, GGML_MAX_SRC 10, GGML_MAX_NAME 64.
    _fields_ = [("type", ctypes.c_int), ("buffer", ctypes.c_void_p),
                ("ne", ctypes.c_int64 * 4), ("nb", ctypes.c_size_t * 4), ("op", ctypes.c_int),
                ("op_params", ctypes.c_int32 * 16), ("flags", ctypes.c_int32),
                ("src", ctypes.c_void_p * 10), ("view_src", ctypes.c_void_p),
                ("view_offs", ctypes.c_size_t), ("data", ctypes.c_void_p),
                ("name", ctypes.c_char * 64), ("extra", ctypes.c_void_p),
                ("padding", ctypes.c_char * 8)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokens", help="comma-separated token ids")
    ap.add_argument("--reference", help="a recorded reference JSON: its chat's prompt + greedy ids")
    ap.add_argument("--chat", type=int, default=0)
    ap.add_argument("--count", type=int, default=32, help="tokens to evaluate")
    ap.add_argument("--layer", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    if args.tokens:
        seq = [int(t) for t in args.tokens.split(",")]
    elif args.reference:
        with open(args.reference, encoding="utf-8") as f:
            chat = json.load(f)["chats"][args.chat]
        seq = chat["prompt_ids"] + chat["greedy_ids"]
    else:
        ap.error("give --tokens or --reference")
    seq = seq[:args.count]
    suffix = f"-{args.layer}"

    store = {}
    position = [0]

    def on_tensor(tensor, ask, _user):
        t = ctypes.cast(tensor, ctypes.POINTER(GgmlTensor)).contents
        name = t.name.decode()
        if ask:  # the scheduler asks which tensors to hand over once computed
            return name.endswith(suffix) or name.startswith("result")
        ne, nb = list(t.ne), list(t.nb)
        if t.type in (0, 1) and nb[1] == nb[0] * ne[0] and nb[2] == nb[1] * ne[1]:
            count = ne[0] * ne[1] * ne[2] * ne[3]
            kind = ctypes.c_float if t.type == 0 else ctypes.c_uint16
            a = np.array((kind * count).from_address(t.data))
            if t.type == 1:
                a = a.view(np.float16).astype(np.float32)
            key = base = f"p{position[0]}|{name}|op{t.op}"
            repeat = 1
            while key in store:
                key = f"{base}|{repeat}"
                repeat += 1
            store[key] = a.reshape(ne[3], ne[2], ne[1], ne[0])
        return True

    callback = ctypes.CFUNCTYPE(ctypes.c_bool, ctypes.c_void_p, ctypes.c_bool,
                                ctypes.c_void_p)(on_tensor)
    L.llama_backend_init()
    model = L.llama_model_load_from_file(args.model.encode(), L.llama_model_default_params())
    cp = L.llama_context_default_params()
    cp.n_ctx = 1024
    cp.n_batch = cp.n_ubatch = 1
    cp.n_threads = cp.n_threads_batch = args.threads
    cp.cb_eval = callback
    cp.cb_eval_user_data = None
    ctx = L.llama_init_from_model(model, cp)
    for i, token in enumerate(seq):
        position[0] = i
        ids = (L.llama_token * 1)(token)
        if L.llama_decode(ctx, L.llama_batch_get_one(ids, 1)) != 0:
            raise SystemExit(f"llama_decode failed at position {i}")
    np.savez(args.out, **store)
    print(f"{len(store)} tensors of {len(seq)} positions -> {args.out}")
    L.llama_free(ctx)
    L.llama_model_free(model)


if __name__ == "__main__":
    main()
