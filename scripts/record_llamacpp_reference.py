"""Records llama.cpp's tokenization, greedy continuations and teacher-forced top-1 ids for
SmolLM2-135M-Instruct. Run through scripts/record-llamacpp-reference.sh, which provides a
virtual environment with llama-cpp-python; the output JSON is committed and read by mixkv's tests."""

import argparse
import hashlib
import json
import time

import jinja2
import llama_cpp
import numpy as np
from llama_cpp import Llama

# Tokenizer corpus: each entry is tokenized with parse_special on and off, without BOS.
CORPUS = [
    "",
    "Hello world",
    "Hello, world! How are you today?",
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure they'll say it's fine, but we've seen what you'd do. DON'T, IT'S, We'Re",
    "Numbers: 0 7 42 123 4567 3.14159 1,000,000 -12e-3 0x1F 2024-12-01",
    "a1b22c333d4444",
    "café naïve résumé façade Ångström über straße",
    "e\u0301 n\u0303 (combining marks)",
    "Привет, мир! Как дела?",
    "Γειά σου Κόσμε",
    "你好，世界！我喜欢编程。",
    "こんにちは世界、カタカナとひらがな。",
    "안녕하세요 세계",
    "مرحبا بالعالم ١٢٣",
    "नमस्ते दुनिया",
    "emoji: 👋🌍🚀 😀😃😄 👍🏽 👨‍👩‍👧‍👦 🇫🇷🇯🇵 ❤️",
    "Unicode numbers: ½ ¾ Ⅻ ② ٣ ३ 𝟙",
    "math: ∀x∈ℝ, x² ≥ 0 ⇒ √(x²) = |x|; ∑ᵢ aᵢ ≠ ∞",
    "symbols: © ® ™ € £ ¥ § ¶ • … — – « » „ “ ” ‘ ’",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))\n",
    "#include <vector>\nint main() {\n\tstd::vector<int> v{1, 2, 3};\n\treturn v.size() > 2 ? 0 : 1;\n}\n",
    "for (int i = 0; i < n; ++i) { x[i] += y[i] * 2.5f; } // loop",
    '{"key": [1, 2, {"nested": null}], "flag": true}',
    "SELECT name, COUNT(*) FROM users WHERE age >= 18 GROUP BY name;",
    "https://example.com/path?query=value&other=42#frag user@example.org",
    "a  b   c    d     e",
    " leading space",
    "  two leading spaces",
    "trailing space ",
    "trailing spaces   ",
    "   ",
    " ",
    "\n",
    "\n\n",
    "\n\n\n\n",
    "line one\nline two\n\nline four\n",
    "\t\ttabs\tand\t\tmore\t",
    "mixed \n \n\t \n  end",
    "windows\r\nline\r\nendings\r\n",
    "nbsp:\u00a0here, ideographic:\u3000there, em:\u2003space, thin:\u2009x",
    "  \n  code indented\n    deeper\n",
    "!!! ??? ... --- *** ### @@@ $$$ %%% ^^^ &&& ((( ))) [[[ ]]] {{{ }}}",
    "'s 't 're 've 'm 'll 'd 'S 'x ''",
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n",
    "<|im_start|><|im_end|><|endoftext|>",
    "text<|im_end|>more text<|endoftext|>",
    "<repo_name>mixkv<file_sep>src/main.cpp<filename>main.cpp<gh_stars>42",
    "<issue_start><issue_comment><issue_closed><jupyter_start><jupyter_text><jupyter_code><jupyter_output><jupyter_script><empty_output>",
    "<|im_start partial <|im_end| |im_end|> <|endoftext",
    "< | im_start | > <im_start> <<|im_start|>> <|im_start|><|im_start|>",
    "Hello<|im_end|>",
    " <|im_end|> ",
    "supercalifragilisticexpialidocious antidisestablishmentarianism pneumonoultramicroscopic",
    "ThisIsCamelCase and snake_case_name and kebab-case-name and SCREAMING_CASE",
    "The year 1984, the 21st century, the 3rd of May, 100% sure, $5.99, 50°C.",
    "SmolLM2 is a family of compact language models available in three sizes: 135M, 360M, and 1.7B"
    " parameters. They are capable of solving a wide range of tasks while being lightweight enough"
    " to run on-device.",
]

# Chat prompts: rendered with the GGUF's own chat template by Jinja (the reference for mixkv's
# template renderer), then tokenized with special tokens parsed.
CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Write a short poem about the sea."}],
    [{"role": "user", "content": "Explain what a KV cache is in a language model."}],
    [{"role": "user", "content": "Give me three tips for learning to cook."}],
    [{"role": "system", "content": "You are a concise assistant."},
     {"role": "user", "content": "Why is the sky blue?"}],
    [{"role": "user", "content": "Write a Python function that reverses a string."}],
    [{"role": "user", "content": "Tell me a story about a robot who learns to paint."}],
    [{"role": "system", "content": "You are a helpful travel guide."},
     {"role": "user", "content": "What should I see in Rome in one day?"}],
]
MAX_NEW_TOKENS = 128


def sha256_of(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--llama-cpp-python", required=True)
    args = ap.parse_args()

    n_ctx = 1024
    # Tokens per llama_decode call for the prompt and the batched teacher-forced pass.
    n_batch = 32
    llm = Llama(model_path=args.model, n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_batch,
                n_threads=args.threads, n_threads_batch=args.threads, logits_all=True, seed=0,
                verbose=False)
    # The same teacher forcing one token per llama_decode call, the path greedy decoding takes.
    # With llama-cpp-python 0.3.16 on an AVX-512 CPU the batched pass gives, once a batch's keys
    # reach about 64, logits for its later rows that differ by up to 30 from the same rows in a
    # shorter batch (whatever the tokens after them), so the two passes disagree on about half
    # the positions; both are recorded.
    step = Llama(model_path=args.model, n_ctx=n_ctx, n_batch=1, n_ubatch=1, n_threads=args.threads,
                 n_threads_batch=args.threads, logits_all=True, seed=0, verbose=False)
    eos = llm.token_eos()

    corpus = []
    for text in CORPUS:
        data = text.encode("utf-8")
        corpus.append({
            "text": text,
            "ids_special": llm.tokenize(data, add_bos=False, special=True),
            "ids_plain": llm.tokenize(data, add_bos=False, special=False),
        })
    # The file's tokenizer.ggml.add_bos_token decides whether add_special adds BOS.
    bos_added = llm.tokenize(b"Hello", add_bos=True, special=True)[:1] == [llm.token_bos()]

    template = jinja2.Environment().from_string(llm.metadata["tokenizer.chat_template"])
    chats = []
    decode_seconds = 0.0
    decode_tokens = 0
    for messages in CHATS:
        prompt = template.render(messages=messages, add_generation_prompt=True)
        prompt_ids = llm.tokenize(prompt.encode("utf-8"), add_bos=False, special=True)

        # Greedy decoding (temperature 0), one token per step, stopping after EOS. The prompt too
        # goes one token per llama_decode call: its batched evaluation is what moves the logits
        # (above), and a continuation from moved keys would not be the model's.
        step.reset()
        step.eval(prompt_ids)
        greedy = []
        t0 = time.perf_counter()
        while len(greedy) < MAX_NEW_TOKENS:
            tok = int(np.argmax(step.scores[step.n_tokens - 1]))
            greedy.append(tok)
            if tok == eos:
                break
            step.eval([tok])
        decode_seconds += time.perf_counter() - t0
        decode_tokens += len(greedy)

        # Teacher forcing: prompt + continuation in n_batch chunks; top-1 after every position.
        seq = prompt_ids + greedy
        llm.reset()
        llm.eval(seq)
        logits = np.asarray(llm.scores[:len(seq)], dtype=np.float64)
        top = np.argsort(-logits, axis=1)[:, :2]
        rows = np.arange(len(seq))
        margin = logits[rows, top[:, 0]] - logits[rows, top[:, 1]]
        step.reset()
        step.eval(seq)
        step_logits = np.asarray(step.scores[:len(seq)], dtype=np.float64)
        step_top = np.argsort(-step_logits, axis=1)[:, :2]
        step_margin = step_logits[rows, step_top[:, 0]] - step_logits[rows, step_top[:, 1]]

        # llama.cpp's own agreement between the batched pass and one-token-at-a-time decoding.
        agree = sum(int(top[len(prompt_ids) - 1 + i, 0]) == t for i, t in enumerate(greedy))
        print(f"chat {len(chats)}: {len(greedy)} tokens, teacher-forced top-1 = greedy at {agree}",
              flush=True)
        chats.append({
            "messages": messages,
            "prompt": prompt,
            "prompt_ids": prompt_ids,
            "greedy_ids": greedy,
            "greedy_text": llm.detokenize(greedy).decode("utf-8", errors="replace"),
            "teacher_forced_top1": [int(t) for t in top[:, 0]],
            "teacher_forced_margin": [round(float(m), 4) for m in margin],
            "teacher_forced_agrees_with_greedy": agree,
            "teacher_forced_step_top1": [int(t) for t in step_top[:, 0]],
            "teacher_forced_step_margin": [round(float(m), 4) for m in step_margin],
        })

    out = {
        "about": "llama.cpp's tokenization, greedy continuations and teacher-forced top-1 ids for "
                 "SmolLM2-135M-Instruct.Q4_1.gguf; recorded by scripts/record-llamacpp-reference.sh",
        "model_file": "SmolLM2-135M-Instruct.Q4_1.gguf",
        "model_sha256": sha256_of(args.model),
        "llama_cpp_python": args.llama_cpp_python,
        "threads": args.threads,
        # The CPU features this llama.cpp build uses (AMX on or off decides its batched path).
        "system_info": llama_cpp.llama_print_system_info().decode("utf-8", errors="replace").strip(),
        "n_ctx": n_ctx,
        "n_batch": n_batch,
        "bos_id": llm.token_bos(),
        "eos_id": eos,
        "add_special_adds_bos": bos_added,
        "teacher_forced_note": "teacher_forced_top1[i] is the argmax of the logits after token i "
                               "of prompt_ids + greedy_ids (evaluated in n_batch chunks); margin is top1 - top2 logit; "
                               "teacher_forced_agrees_with_greedy counts continuation positions "
                               "where it equals llama.cpp's own greedy token; teacher_forced_step_* are the same "
                               "with one token per llama_decode call (greedy decoding's path: greedy_ids "
                               "evaluate the prompt one token per call too)",
        "greedy_decode_tokens_per_s": round(decode_tokens / decode_seconds, 1),
        "max_new_tokens": MAX_NEW_TOKENS,
        "corpus": corpus,
        "chats": chats,
    }
    # One line per scalar field, corpus entry and chat, so a re-recording diffs readably.
    def dumps(value):
        return json.dumps(value, ensure_ascii=False)

    lines = []
    for key, value in out.items():
        if isinstance(value, list):
            items = ",\n".join("  " + dumps(v) for v in value)
            lines.append(f" {dumps(key)}: [\n{items}\n ]")
        else:
            lines.append(f" {dumps(key)}: {dumps(value)}")
    with open(args.out, "w", encoding="utf-8") as f:
        f.write("{\n" + ",\n".join(lines) + "\n}\n")


if __name__ == "__main__":
    main()
