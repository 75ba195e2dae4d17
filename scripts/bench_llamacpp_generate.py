"""llama.cpp's plain greedy decode tokens/s on the prompt set mixkv bench-generate uses
(bench/generate-prompts.jsonl), so one sitting can put mixkv plain, mixkv speculative and llama.cpp
plain side by side. Each prompt is rendered with the GGUF's own chat template (as mixkv renders it),
then prefilled and decoded one token per call with top-1 sampling until an end-of-generation token
or --max-tokens; tokens/s count from the prompt's prefill to the last token, prefill included, as
bench-generate's do, and decode only (the tokens after the first over the time after it). Medians over --runs runs; the 1-minute load average is printed beside them.
Run through scripts/bench-llamacpp-generate.sh (it provides llama-cpp-python)."""

import argparse
import json
import os
import statistics
import sys
import time

import jinja2
import llama_cpp
import numpy as np
from llama_cpp import Llama


def render(template, text, bos, eos):
    env = jinja2.Environment(loader=jinja2.BaseLoader(), trim_blocks=True, lstrip_blocks=True)
    return env.from_string(template).render(
        messages=[{"role": "user", "content": text}],
        add_generation_prompt=True,
        bos_token=bos,
        eos_token=eos,
    )


def run_once(llm, prompt_ids, max_tokens, stops):
    llm.reset()
    start = time.perf_counter()
    llm.eval(prompt_ids)
    generated = 0
    first = None  # when the first token (the prefill's) was picked
    while generated < max_tokens:
        # The last row's logits (only that row is computed: logits_all off); greedy, as
        # mixkv's plain run.
        logits = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))
        tok = int(logits.argmax())
        generated += 1
        if first is None:
            first = time.perf_counter()
        if tok in stops:
            break
        if generated == max_tokens:
            break
        llm.eval([tok])
    end = time.perf_counter()
    return generated, end - start, end - first


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="the GGUF file (SmolLM2-135M-Instruct.Q4_1.gguf)")
    ap.add_argument("--prompts", default=os.path.join(here, "..", "bench", "generate-prompts.jsonl"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    a = ap.parse_args()

    llm = Llama(model_path=a.model, n_ctx=2048, n_batch=512, n_threads=a.threads,
                n_threads_batch=a.threads, logits_all=False, verbose=False)
    meta = llm.metadata
    template = meta.get("tokenizer.chat_template")
    if template is None:
        sys.exit(f"{a.model}: no tokenizer.chat_template")
    bos = llm.detokenize([llm.token_bos()]).decode("utf-8", "replace") if llm.token_bos() >= 0 else ""
    eos = llm.detokenize([llm.token_eos()]).decode("utf-8", "replace")
    stops = {llm.token_eos()}
    for i in range(llm.n_vocab()):
        if llama_cpp.llama_token_is_eog(llama_cpp.llama_model_get_vocab(llm.model), i):
            stops.add(i)

    prompts = [json.loads(line) for line in open(a.prompts, encoding="utf-8") if line.strip()]
    rows = []
    for p in prompts:
        ids = llm.tokenize(render(template, p["text"], bos, eos).encode("utf-8"), add_bos=False,
                           special=True)
        tps, dtps, tokens = [], [], 0
        for _ in range(a.runs):
            tokens, seconds, after_first = run_once(llm, ids, a.max_tokens, stops)
            tps.append(tokens / seconds)
            dtps.append((tokens - 1) / after_first if after_first > 0 else 0.0)
        rows.append({"name": p.get("name", ""), "category": p.get("category", "file"),
                     "prompt_tokens": len(ids), "generated_tokens": tokens,
                     "tokens_per_second": statistics.median(tps),
                     "decode_tokens_per_second": statistics.median(dtps)})
    load = os.getloadavg()[0]
    cats = {}
    for r in rows:  # per category: tokens over the medians' seconds, as bench-generate sums
        c = cats.setdefault(r["category"], [0.0, 0.0, 0.0, 0.0])
        c[0] += r["generated_tokens"]
        c[1] += r["generated_tokens"] / r["tokens_per_second"]
        if r["decode_tokens_per_second"] > 0:
            c[2] += r["generated_tokens"] - 1
            c[3] += (r["generated_tokens"] - 1) / r["decode_tokens_per_second"]
    out = {"llama_cpp_python": llama_cpp.__version__, "model": a.model, "threads": a.threads,
           "runs": a.runs, "max_tokens": a.max_tokens, "load_average": load, "prompts": rows,
           "categories": [{"category": k, "tokens_per_second": v[0] / v[1],
                           "decode_tokens_per_second": v[2] / v[3] if v[3] > 0 else 0.0}
                          for k, v in cats.items()]}
    if a.json:
        print(json.dumps(out))
        return
    print(f"llama.cpp {llama_cpp.__version__} plain greedy decode: {a.threads} threads, "
          f"{a.runs} runs each (medians), load {load:.1f}")
    print(f"{'prompt':<10} {'category':<8} {'prompt':>6} {'tokens':>6} {'t/s':>8} {'decode t/s':>10}")
    for r in rows:
        print(f"{r['name']:<10} {r['category']:<8} {r['prompt_tokens']:>6} "
              f"{r['generated_tokens']:>6} {r['tokens_per_second']:>8.1f} "
              f"{r['decode_tokens_per_second']:>10.1f}")
    for c in out["categories"]:
        print(f"{'all':<10} {c['category']:<8} {'':>6} {'':>6} {c['tokens_per_second']:>8.1f} "
              f"{c['decode_tokens_per_second']:>10.1f}")


if __name__ == "__main__":
    main()
