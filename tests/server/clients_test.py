#!/usr/bin/env python3
"""`mixkv serve` against clients nobody here wrote: the official `openai` Python client, curl and
schemathesis (fuzzing the server's own /openapi.json), plus a load of concurrent streaming
clients, clients killed mid-stream and SIGTERM under load. CTest runs it (tests/CMakeLists.txt).

It makes its own virtual environment with the pinned PyPI packages (PINS) in
${MIXKV_TEST_VENV:-${XDG_CACHE_HOME:-~/.cache}/mixkv/server-test-venv}, reused while the pins
match, and re-runs itself inside it.

The model is SmolLM2-135M (with the ngram drafter) when `mixkv generate smollm2-135m` runs, else
tiny-swa with tiny-eagle. Sizes are bounded in count and time (SIZES); docs/server.md gives them.
"""
import argparse
import http.client
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time

PINS = ["openai==3.51.0", "schemathesis==4.32.5"]

# Bounded in count and in time; the whole script stays around a minute on two cores.
SIZES = {
    "load_clients": 64,
    "load_requests_per_client": 8,
    "load_max_tokens": {"tiny": 16, "smollm": 8},
    "load_deadline_s": 120,
    "fuzz_examples_per_operation": 200,  # plus schemathesis' coverage phase: ~1,100 bodies
    "fuzz_min_bodies": 1000,
    "killed_clients": 4,
    "drain_clients": 16,
}


def venv_dir():
    if os.environ.get("MIXKV_TEST_VENV"):
        return os.environ["MIXKV_TEST_VENV"]
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "mixkv", "server-test-venv")


def ensure_venv():
    """Creates the venv with PINS when missing or stale; re-executes this script inside it."""
    d = venv_dir()
    py = os.path.join(d, "bin", "python")
    stamp = os.path.join(d, "mixkv-pins.txt")
    want = "\n".join(PINS) + "\n"
    if not (os.path.exists(stamp) and open(stamp).read() == want):
        print(f"clients_test: creating {d} with {' '.join(PINS)}", flush=True)
        base = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
        subprocess.run([base, "-m", "venv", "--clear", d], check=True)
        subprocess.run([py, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"] + PINS,
                       check=True)
        with open(stamp, "w") as f:
            f.write(want)
    if os.path.realpath(sys.prefix) != os.path.realpath(d):
        os.execv(py, [py] + sys.argv)
    return d


class Failure(Exception):
    pass


def check(cond, what):
    if not cond:
        raise Failure(what)


class Serve:
    """`mixkv serve` on a free loopback port; stop() sends a signal and returns the exit status."""

    def __init__(self, mixkv, model, extra=()):
        self.cmd = [mixkv, "serve", model, "--port", "0"] + list(extra)
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True)
        self.lines = []
        deadline = time.time() + 180
        self.port = None
        while time.time() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            self.lines.append(line)
            m = re.search(r"serving .* at http://[^:]+:(\d+)", line)
            if m:
                self.port = int(m.group(1))
                break
        check(self.port is not None, f"{' '.join(self.cmd)} did not start: {''.join(self.lines)}")
        threading.Thread(target=self._drain_output, daemon=True).start()

    def _drain_output(self):
        for line in self.proc.stdout:
            self.lines.append(line)

    def stop(self, sig=15, timeout=60):
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise Failure(f"mixkv serve did not exit within {timeout} s of signal {sig}")


def request(port, method, path, body=None, headers=None, timeout=120):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    data = json.dumps(body) if isinstance(body, (dict, list)) else body
    h = {"Content-Type": "application/json"}
    h.update(headers or {})
    conn.request(method, path, body=data, headers=h)
    r = conn.getresponse()
    raw = r.read().decode("utf-8", "replace")
    conn.close()
    try:
        parsed = json.loads(raw)
    except ValueError:
        parsed = raw
    return r.status, dict(r.getheaders()), parsed


def stream_events(port, path, body, on_first=None, timeout=120):
    """POSTs with stream: true; returns the events (JSON, or the string "[DONE]"), checking the
    SSE framing."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    if r.status != 200:
        raise Failure(f"stream answered {r.status}: {r.read()[:300]}")
    check(r.getheader("Content-Type") == "text/event-stream", "stream content type")
    events, buf = [], b""
    while True:
        chunk = r.read1(65536) if hasattr(r, "read1") else r.read(65536)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            text = ev.decode("utf-8")
            check(text.startswith("data: "), f"an event that is not data: {text[:100]}")
            data = text[6:]
            events.append("[DONE]" if data == "[DONE]" else json.loads(data))
            if on_first and len(events) == 1:
                on_first()
    conn.close()
    check(buf == b"", f"bytes after the last event: {buf[:100]}")
    return events


def stream_tokens(port, prompt, max_tokens, chat=False):
    """Streams a completion; checks the stream's shape; returns (token ids, text)."""
    body = {"max_tokens": max_tokens, "stream": True, "ignore_eos": True,
            "stream_options": {"include_usage": True}}
    if chat:
        body["messages"] = prompt
    else:
        body["prompt"] = prompt
    ev = stream_events(port, "/v1/chat/completions" if chat else "/v1/completions", body)
    check(len(ev) >= 3 and ev[-1] == "[DONE]", f"stream does not end with usage and [DONE]: {ev[-3:]}")
    usage = ev[-2]
    check(usage["choices"] == [] and "usage" in usage, "the usage chunk")
    ids, text, finishes = [], "", 0
    for e in ev[:-2]:
        check(e["id"] == ev[0]["id"], "one id per stream")
        c = e["choices"][0]
        ids += c.get("token_ids", [])
        text += c["delta"].get("content", "") if chat else c["text"]
        if c["finish_reason"] is not None:
            finishes += 1
    check(finishes == 1, f"{finishes} finish events")
    check(ev[-3]["choices"][0]["finish_reason"] in ("length", "stop"), "finish reason")
    check(usage["usage"]["completion_tokens"] == len(ids), "usage counts the streamed tokens")
    return ids, text


def metrics(port):
    _, _, text = request(port, "GET", "/metrics")
    values = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, value = line.rsplit(" ", 1)
        base = name.split("{", 1)[0]
        values[name] = float(value)
        values[base + "{*}"] = values.get(base + "{*}", 0.0) + float(value)
    return values


def wait_idle(port, timeout=10):
    deadline = time.time() + timeout
    while time.time() < deadline:
        m = metrics(port)
        if (m.get("mixkv:num_requests_running{*}") == 0 and m.get("mixkv:num_requests_waiting{*}") == 0
                and m.get("mixkv:kv_cache_usage_perc{*}", 0) == 0):
            return m
        time.sleep(0.02)
    raise Failure(f"not idle after {timeout} s: running {m.get('mixkv:num_requests_running{*}')}, "
                  f"waiting {m.get('mixkv:num_requests_waiting{*}')}, "
                  f"kv usage {m.get('mixkv:kv_cache_usage_perc{*}')}")


# --- the tests ---

def test_openai_client(srv, cfg):
    import openai
    c = openai.OpenAI(base_url=f"http://127.0.0.1:{srv.port}/v1", api_key="unused")
    models = c.models.list()
    check([m.id for m in models.data] == [cfg["name"]], f"models: {models}")
    r = c.completions.create(model=cfg["name"], prompt=cfg["text_prompt"], max_tokens=8,
                             temperature=0, seed=7)
    check(r.object == "text_completion" and len(r.choices) == 1, f"completion: {r}")
    check(r.choices[0].finish_reason in ("length", "stop"), "finish_reason")
    check(0 < r.usage.completion_tokens <= 8, f"usage: {r.usage}")
    chunks = list(c.completions.create(model=cfg["name"], prompt=cfg["text_prompt"], max_tokens=8,
                                       stream=True, stream_options={"include_usage": True}))
    text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
    check(chunks[-1].usage is not None, "include_usage gives a usage chunk")
    check(text == r.choices[0].text, f"streamed {text!r} != {r.choices[0].text!r}")
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    if cfg["chat"]:
        cr = c.chat.completions.create(model=cfg["name"], messages=messages, max_tokens=12)
        check(cr.object == "chat.completion" and cr.choices[0].message.role == "assistant", f"chat: {cr}")
        check(cr.choices[0].finish_reason in ("length", "stop"), "chat finish_reason")
        chunks = list(c.chat.completions.create(model=cfg["name"], messages=messages, max_tokens=12,
                                                stream=True))
        check(chunks[0].choices[0].delta.role == "assistant", "the first delta names the role")
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        check(text == cr.choices[0].message.content, f"chat streamed {text!r} != {cr.choices[0].message.content!r}")
    else:
        try:
            c.chat.completions.create(model=cfg["name"], messages=messages, max_tokens=4)
            raise Failure("chat without a template was served")
        except openai.BadRequestError as e:
            check("chat template" in str(e), str(e))
    try:
        c.completions.create(model="no-such-model", prompt="x", max_tokens=2)
        raise Failure("an unknown model was served")
    except openai.NotFoundError:
        pass
    try:
        c.completions.create(model=cfg["name"], prompt="x", max_tokens=2, extra_body={"top_k": "many"})
        raise Failure("a wrong type was served")
    except openai.BadRequestError as e:
        check("top_k" in str(e), str(e))


def test_curl(srv, cfg):
    base = f"http://127.0.0.1:{srv.port}"
    out = subprocess.run(["curl", "-sS", "-f", f"{base}/v1/completions", "-H",
                          "Content-Type: application/json", "-d",
                          json.dumps({"prompt": cfg["text_prompt"], "max_tokens": 4})],
                         capture_output=True, text=True, check=True).stdout
    check(json.loads(out)["usage"]["completion_tokens"] > 0, out)
    out = subprocess.run(["curl", "-sS", "-N", f"{base}/v1/completions", "-d",
                          json.dumps({"prompt": cfg["text_prompt"], "max_tokens": 4, "stream": True})],
                         capture_output=True, text=True, check=True).stdout
    check(out.rstrip().endswith("data: [DONE]"), out[-200:])
    code = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", f"{base}/health"],
                          capture_output=True, text=True).stdout
    check(code == "200", f"/health {code}")


def offline(mixkv, cfg, prompt_ids, max_tokens, draft):
    cmd = [mixkv, "generate", cfg["model"], "--prompt-ids", *map(str, prompt_ids),
           "--max-tokens", str(max_tokens), "--json"]
    if draft:
        cmd += ["--draft", cfg["draft"], "--num-spec-tokens", str(cfg["k"])]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return json.loads(out.splitlines()[0])["tokens"]


def test_greedy_equals_generate(mixkv, cfg, srv_plain, srv_draft):
    for prompt in cfg["id_prompts"][:2]:
        for draft, srv in ((False, srv_plain), (True, srv_draft)):
            want = offline(mixkv, cfg, prompt, 24, draft)
            s, _, r = request(srv.port, "POST", "/v1/completions",
                              {"prompt": prompt, "max_tokens": 24, "ignore_eos": True})
            check(s == 200, f"{s} {r}")
            got = r["choices"][0]["token_ids"]
            n = min(len(got), len(want))
            check(n > 0 and got[:n] == want[:n],
                  f"{'drafter' if draft else 'plain'}: HTTP {got} != generate {want}")
            ids, _ = stream_tokens(srv.port, prompt, 24)
            check(ids == got, f"streamed {ids} != {got}")


def test_load(srv, cfg):
    clients, per = SIZES["load_clients"], SIZES["load_requests_per_client"]
    max_tokens = SIZES["load_max_tokens"][cfg["kind"]]
    prompts = cfg["id_prompts"]
    want = []
    for p in prompts:
        _, _, r = request(srv.port, "POST", "/v1/completions",
                          {"prompt": p, "max_tokens": max_tokens, "ignore_eos": True})
        want.append(r["choices"][0]["token_ids"])
    results, errors, ids = {}, [], set()
    lock = threading.Lock()
    deadline = time.time() + SIZES["load_deadline_s"]

    def client(c):
        for i in range(per):
            if time.time() > deadline:
                with lock:
                    errors.append(f"client {c}: deadline")
                return
            j = (c + i) % len(prompts)
            try:
                tokens, _ = stream_tokens(srv.port, prompts[j], max_tokens)
                with lock:
                    results[(c, i)] = tokens == want[j]
            except Exception as e:  # noqa: BLE001 - reported below
                with lock:
                    errors.append(f"client {c} request {i}: {e}")

    t0 = time.time()
    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(SIZES["load_deadline_s"] + 30)
    seconds = time.time() - t0
    check(not errors, f"{len(errors)} failed: {errors[:3]}")
    check(len(results) == clients * per, f"{len(results)} of {clients * per} completed")
    check(all(results.values()), f"{sum(not v for v in results.values())} streams gave other tokens")
    m = wait_idle(srv.port)
    print(f"  load: {clients} clients x {per} streaming requests of {max_tokens} tokens in "
          f"{seconds:.1f} s; drafts {m.get('mixkv:spec_decode_num_drafts_total{*}', 0):.0f}, "
          f"accepted {m.get('mixkv:spec_decode_num_accepted_tokens_total{*}', 0):.0f}", flush=True)


def test_killed_clients(srv, cfg):
    before = metrics(srv.port).get("mixkv:generation_tokens_total{*}", 0)
    body = json.dumps({"prompt": cfg["id_prompts"][0], "max_tokens": cfg["long_tokens"],
                       "stream": True, "ignore_eos": True})
    code = ("import http.client, sys\n"
            f"c = http.client.HTTPConnection('127.0.0.1', {srv.port})\n"
            f"c.request('POST', '/v1/completions', body={body!r}, headers={{'Content-Type': 'application/json'}})\n"
            "r = c.getresponse()\n"
            "r.read1(16)\n"
            "print('streaming', flush=True)\n"
            "import time; time.sleep(600)\n")
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
             for _ in range(SIZES["killed_clients"])]
    for p in procs:
        check(p.stdout.readline().strip() == "streaming", "a client that did not start streaming")
    running = metrics(srv.port).get("mixkv:num_requests_running{*}", 0)
    for p in procs:
        p.kill()
        p.wait()
    m = wait_idle(srv.port)
    generated = m.get("mixkv:generation_tokens_total{*}", 0) - before
    check(generated < SIZES["killed_clients"] * cfg["long_tokens"],
          f"killed clients' requests ran to the end ({generated:.0f} tokens)")
    print(f"  killed clients: {len(procs)} killed mid-stream ({running:.0f} were running), blocks "
          f"back to idle, {generated:.0f} of {len(procs) * cfg['long_tokens']} tokens generated", flush=True)


def test_fuzz(srv, cfg, venv):
    st = os.path.join(venv, "bin", "schemathesis")
    t0 = time.time()
    # schemathesis keeps a cache in its working directory: a scratch one, not the tree.
    with tempfile.TemporaryDirectory(prefix="mixkv-fuzz-") as scratch:
        out = subprocess.run(
            [st, "run", f"http://127.0.0.1:{srv.port}/openapi.json", "--mode", "negative",
             "--checks", "not_a_server_error,negative_data_rejection", "--include-method", "POST",
             "--phases", "coverage,fuzzing", "-n", str(SIZES["fuzz_examples_per_operation"]),
             "--generation-deterministic", "-w", "1", "--request-timeout", "30"],
            capture_output=True, text=True, timeout=300, cwd=scratch)
    m = re.search(r"(\d+) generated", out.stdout)
    bodies = int(m.group(1)) if m else 0
    check(out.returncode == 0, f"schemathesis found issues:\n{out.stdout[-4000:]}")
    check(bodies >= SIZES["fuzz_min_bodies"], f"only {bodies} bodies sent:\n{out.stdout[-2000:]}")
    s, _, r = request(srv.port, "POST", "/v1/completions",
                      {"prompt": cfg["id_prompts"][0], "max_tokens": 4, "ignore_eos": True})
    check(s == 200 and r["usage"]["completion_tokens"] == 4, f"after the fuzz: {s} {r}")
    wait_idle(srv.port)
    print(f"  fuzz: {bodies} malformed or mutated bodies, all 4xx, in {time.time() - t0:.1f} s", flush=True)


def test_sigterm_drain(mixkv, cfg):
    srv = Serve(mixkv, cfg["model"], cfg["draft_args"] + ["--shutdown-timeout", "30"])
    done, errors = [], []
    started = threading.Semaphore(0)

    def client(i):
        try:
            ev = stream_events(srv.port, "/v1/completions",
                               {"prompt": cfg["id_prompts"][i % len(cfg["id_prompts"])],
                                "max_tokens": cfg["drain_tokens"], "ignore_eos": True, "stream": True},
                               on_first=started.release)
            check(ev[-1] == "[DONE]" and ev[-2]["choices"][0]["finish_reason"] == "length",
                  f"stream {i} did not finish: {ev[-2:]}")
            done.append(i)
        except Exception as e:  # noqa: BLE001
            errors.append(f"{i}: {e}")
            started.release()

    n = SIZES["drain_clients"]
    threads = [threading.Thread(target=client, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for _ in range(n):
        started.acquire(timeout=60)
    t0 = time.time()
    srv.proc.send_signal(15)
    time.sleep(0.05)
    try:
        s, _, _ = request(srv.port, "POST", "/v1/completions", {"prompt": [1, 2], "max_tokens": 2}, timeout=5)
        check(s == 503, f"a request after SIGTERM got {s}")
    except (ConnectionError, OSError):
        pass  # the listener already closed
    rc = srv.proc.wait(40)
    for t in threads:
        t.join(10)
    check(rc == 0, f"exit status {rc} after SIGTERM: {''.join(srv.lines[-5:])}")
    check(not errors and len(done) == n, f"{len(done)} of {n} streams finished; {errors[:3]}")
    print(f"  SIGTERM: {n} streams drained, exit 0 in {time.time() - t0:.1f} s", flush=True)


def pick_model(mixkv, want):
    smollm = {"kind": "smollm", "model": "smollm2-135m", "name": "smollm2-135m", "draft": "ngram", "k": 3,
              "chat": True, "text_prompt": "The capital of France is",
              "id_prompts": [[504, 3575, 282, 4649, 314], [1780, 2365, 253, 655, 28, 253], [22, 23, 24]],
              "long_tokens": 400, "drain_tokens": 24}
    tiny = {"kind": "tiny", "model": "tiny-swa", "name": "tiny-swa", "draft": "tiny-eagle", "k": 3,
            "chat": False, "text_prompt": "Once upon a time",
            "id_prompts": [[1, 2, 3], [72, 101, 108, 108, 111, 32, 119], list(range(40, 80))],
            "long_tokens": 1900, "drain_tokens": 200}
    if want == "auto":
        ok = subprocess.run([mixkv, "generate", "smollm2-135m", "--max-tokens", "1"],
                            capture_output=True).returncode == 0
        cfg = smollm if ok else tiny
    else:
        cfg = smollm if want.startswith("smollm") else tiny
    cfg["draft_args"] = ["--draft", cfg["draft"], "--num-spec-tokens", str(cfg["k"])]
    return cfg


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mixkv", help="the mixkv binary")
    ap.add_argument("--model", default="auto", help="smollm2-135m, tiny-swa or auto")
    args = ap.parse_args()
    venv = ensure_venv()
    mixkv = os.path.abspath(args.mixkv)
    cfg = pick_model(mixkv, args.model)
    print(f"clients_test: {cfg['model']} with drafter {cfg['draft']}", flush=True)
    t_all = time.time()
    failures = []
    plain = Serve(mixkv, cfg["model"], ["--max-num-seqs", "16", "--max-queue", "128"])
    draft = Serve(mixkv, cfg["model"], cfg["draft_args"] + ["--max-num-seqs", "16", "--max-queue", "128"])

    def run(name, fn, *a):
        t0 = time.time()
        try:
            fn(*a)
            print(f"ok   {name} ({time.time() - t0:.1f} s)", flush=True)
        except Exception as e:  # noqa: BLE001
            failures.append(name)
            print(f"FAIL {name}: {e}", flush=True)

    run("openai client", test_openai_client, plain, cfg)
    run("curl", test_curl, plain, cfg)
    run("greedy HTTP == generate, plain and drafter", test_greedy_equals_generate, mixkv, cfg, plain, draft)
    run("load with a drafter", test_load, draft, cfg)
    run("killed clients free their blocks", test_killed_clients, draft, cfg)
    run("schemathesis fuzz", test_fuzz, plain, cfg, venv)
    for srv in (plain, draft):
        rc = srv.stop()
        if rc != 0:
            failures.append(f"exit status {rc}")
    run("SIGTERM under load drains", test_sigterm_drain, mixkv, cfg)
    print(f"clients_test: {'FAILED ' + ', '.join(failures) if failures else 'all passed'} "
          f"in {time.time() - t_all:.1f} s", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
