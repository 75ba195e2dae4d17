#!/usr/bin/env python3
"""Throughput, time to first token and inter-token latency of `mixkv serve` (or any
OpenAI-compatible server) at several client counts: each client streams completions of
--max-tokens tokens back to back for --seconds; TTFT and ITL come from the arrival times of the
stream's events, split per token when one event carries several (a speculative step).

  scripts/bench_serve.py build/mixkv smollm2-135m --clients 1 8 32 [--draft ngram]
  scripts/bench_serve.py --url http://127.0.0.1:8080 --clients 1 8 32   # a server already running

Standard library only. Prints one JSON line per client count.
"""
import argparse
import http.client
import json
import re
import statistics
import subprocess
import sys
import threading
import time


def pct(values, p):
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def stream_once(host, port, prompt, max_tokens, model):
    body = {"prompt": prompt, "max_tokens": max_tokens, "stream": True, "ignore_eos": True,
            "temperature": 0}
    if model:
        body["model"] = model
    conn = http.client.HTTPConnection(host, port, timeout=300)
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", body=json.dumps(body),
                 headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    if r.status != 200:
        raise RuntimeError(f"{r.status}: {r.read()[:200]}")
    times, buf = [], b""
    while True:
        chunk = r.read1(65536)
        if not chunk:
            break
        now = time.perf_counter()
        buf += chunk
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            data = ev[6:]
            if data == b"[DONE]":
                continue
            j = json.loads(data)
            if not j.get("choices"):
                continue
            c = j["choices"][0]
            n = len(c.get("token_ids", [])) or (1 if c.get("text") else 0)
            times += [now] * n
    conn.close()
    return t0, times


def run_level(host, port, clients, seconds, prompt, max_tokens, model):
    ttft, itl, tokens, errors = [], [], [0], [0]
    lock = threading.Lock()
    stop_at = time.perf_counter() + seconds

    def client():
        while time.perf_counter() < stop_at:
            try:
                t0, times = stream_once(host, port, prompt, max_tokens, model)
            except (OSError, RuntimeError, http.client.HTTPException, ValueError):
                with lock:  # a stream cut short or refused: counted, not timed
                    errors[0] += 1
                continue
            with lock:
                if times:
                    ttft.append(times[0] - t0)
                    itl.extend(b - a for a, b in zip(times, times[1:]))
                tokens[0] += len(times)

    start = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    return {"clients": clients, "tokens_per_s": round(tokens[0] / wall, 1), "requests": len(ttft),
            "failed_requests": errors[0],
            "ttft_p50_ms": round(1e3 * pct(ttft, 50), 1), "ttft_p99_ms": round(1e3 * pct(ttft, 99), 1),
            "itl_p50_ms": round(1e3 * pct(itl, 50), 2), "itl_p99_ms": round(1e3 * pct(itl, 99), 2),
            "itl_mean_ms": round(1e3 * statistics.mean(itl), 2) if itl else 0}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mixkv", nargs="?")
    ap.add_argument("model", nargs="?")
    ap.add_argument("--url", help="an OpenAI-compatible server already running")
    ap.add_argument("--draft")
    ap.add_argument("--num-spec-tokens", default="3")
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--prompt", default="The history of the city of Paris begins")
    ap.add_argument("--max-num-seqs", default="32")
    ap.add_argument("--threads", help="mixkv serve --threads (default: its own)")
    args = ap.parse_args()
    proc, model = None, None
    if args.url:
        m = re.match(r"http://([^:/]+):(\d+)", args.url)
        host, port = m.group(1), int(m.group(2))
    else:
        cmd = [args.mixkv, "serve", args.model, "--port", "0", "--max-num-seqs", args.max_num_seqs,
               "--max-queue", "256"]
        if args.draft:
            cmd += ["--draft", args.draft, "--num-spec-tokens", args.num_spec_tokens]
        if args.threads:
            cmd += ["--threads", args.threads]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        host, port = "127.0.0.1", None
        for line in proc.stdout:
            m = re.search(r"at http://[^:]+:(\d+)", line)
            if m:
                port = int(m.group(1))
                break
        model = args.model
    stream_once(host, port, args.prompt, 4, model)  # warm up
    for c in args.clients:
        r = run_level(host, port, c, args.seconds, args.prompt, args.max_tokens, model)
        r["draft"] = args.draft
        print(json.dumps(r), flush=True)
    if proc:
        proc.terminate()
        proc.wait(60)


if __name__ == "__main__":
    sys.exit(main())
