"""The GIL is released in long calls: plans run in threads at once, and Python runs meanwhile."""

import threading
import time

import mixkv
from conftest import SMALL_CONFIG

MODELS = [("qwen3.5-27b", "dflash-qwen3.5-27b"), ("kimi-linear-48b", None)]


def test_two_plans_in_threads_at_once_equal_the_plans_made_one_after_the_other():
    expected = [mixkv.plan(t, d, gpu="h200", tp=2).to_dict() for t, d in MODELS]
    results = [None, None]
    barrier = threading.Barrier(2)

    def run(i):
        barrier.wait()
        for _ in range(5):
            results[i] = mixkv.plan(MODELS[i][0], MODELS[i][1], gpu="h200", tp=2).to_dict()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == expected


def test_python_runs_while_verify_runs_in_another_thread():
    # With the GIL held for the whole call, no tick of the main thread could fall inside it.
    span = {}

    def run():
        span["start"] = time.perf_counter()
        span["report"] = mixkv.verify(SMALL_CONFIG, requests=8)
        span["end"] = time.perf_counter()

    thread = threading.Thread(target=run)
    ticks = []
    thread.start()
    while thread.is_alive():
        ticks.append(time.perf_counter())
        time.sleep(0.001)
    thread.join()
    assert span["report"].passed
    inside = [t for t in ticks if span["start"] + 0.01 < t < span["end"] - 0.01]
    assert span["end"] - span["start"] > 0.05  # long enough to tell
    assert len(inside) >= 5, (len(inside), span["end"] - span["start"])


def test_verify_and_generate_in_threads_at_once_equal_their_results_alone(small_config_file):
    def work():
        return (mixkv.verify(small_config_file, requests=4).to_dict(),
                [g.tokens for g in mixkv.generate("tiny-swa", "abc", max_tokens=8)])

    expected = work()
    results = [None, None]

    def run(i):
        results[i] = work()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [expected, expected]
