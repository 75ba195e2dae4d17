"""Python overhead of the run-time manager: one decode step (allocate + commit) per request, for
1,024 running requests, driven from Python and, as the baseline, by the same loop in C++.

    python python/bench/bench_manager.py [--requests 1024] [--steps 64] [--repeats 5]

Prints the time per request-step both ways and their difference, the Python overhead per
allocate + commit pair (aim: at most 1 us, against 3.8 us for vLLM's own Python manager). Each
step over all requests is timed on its own and the median step is reported: on a shared
machine a step the process spends descheduled would otherwise dominate a mean.
"""

import argparse
import statistics
import time

import mixkv


def setup(requests, steps):
    # Full attention, blocks of 16 tokens, room for every request's prompt and decode steps.
    plan = mixkv.plan("qwen3-8b", memory="40GiB", max_model_len=4096, request_len=1024,
                      block_size=16)
    m = mixkv.KvCacheManager(plan, num_spec_tokens=0, prefix_caching=False)
    for i in range(requests):
        m.add_request(i, [i % 1000 + 1] * 100)
        assert m.admit(i) is not None, "the plan holds too few blocks"
        m.commit(i, 100, [7])
    return m


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=1024)
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args()
    ids = list(range(a.requests))
    token = [7]
    py_steps, cpp_steps = [], []
    for _ in range(a.repeats):
        m = setup(a.requests, a.steps)
        allocate, commit = m.allocate, m.commit
        for _ in range(a.steps):
            t0 = time.perf_counter()
            for i in ids:
                if not allocate(i, 1, 0):
                    raise SystemExit("the pool is full")
                commit(i, 1, token)
            py_steps.append(time.perf_counter() - t0)
        assert m.check_invariants() == ""
        m = setup(a.requests, a.steps)
        cpp_steps += [m._decode_steps_in_cpp(ids, 1, 7) for _ in range(a.steps)]
    py_ns = statistics.median(py_steps) / a.requests * 1e9
    cpp_ns = statistics.median(cpp_steps) / a.requests * 1e9
    print(f"requests {a.requests}, {a.steps} steps x {a.repeats} repeats, median step")
    print(f"python loop     {py_ns:8.1f} ns per allocate + commit pair")
    print(f"c++ loop        {cpp_ns:8.1f} ns per allocate + commit pair")
    print(f"python overhead {py_ns - cpp_ns:8.1f} ns per request-step (aim <= 1000)")


if __name__ == "__main__":
    main()
