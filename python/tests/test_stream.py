"""Generator.stream: tokens as the engine commits them, equal to generate's, stoppable."""

import gc
import os

import pytest

import mixkv


def _smollm_file():
    base = os.environ.get("MIXKV_MODEL_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "mixkv", "models")
    path = os.path.join(base, "SmolLM2-135M-Instruct.Q4_1.gguf")
    return path if os.path.isfile(path) else None


def test_tokens_arrive_before_the_run_ends():
    # buffer=0: the engine waits in its per-step callback until the reader took the step's
    # token, so when the first token is read the engine has committed at most two steps' worth
    # of the 16 (plain decoding: one token a step), whatever the threads' timing.
    gen = mixkv.Generator("tiny-swa")
    it = gen.stream("Hello", max_tokens=16, buffer=0)
    first = next(it)
    assert 1 <= it.generated <= 2 and not it.finished
    rest = list(it)
    assert it.finished and it.generated == 16
    assert [first] + rest == list(gen.generate("Hello", max_tokens=16).tokens)


@pytest.mark.parametrize("draft,k", [(None, None), ("ngram", 3), ("tiny-eagle", 2),
                                     ("oracle", 3)])
def test_stream_equals_generate_and_the_cli(draft, k):
    gen = mixkv.Generator("tiny-swa", draft=draft, num_spec_tokens=k)
    streamed = list(gen.stream("Once upon a time", max_tokens=12))
    whole = gen.generate("Once upon a time", max_tokens=12)
    assert streamed == list(whole.tokens) and len(streamed) == 12
    assert list(gen.stream([72, 101, 108], max_tokens=5)) == list(
        gen.generate([72, 101, 108], max_tokens=5).tokens)


@pytest.mark.skipif(_smollm_file() is None, reason="SmolLM2's GGUF is not fetched (make deps)")
def test_stream_equals_generate_on_smollm2():
    gen = mixkv.Generator("smollm2-135m", memory="256MiB")
    streamed = list(gen.stream("What is the capital of France?", max_tokens=8))
    whole = gen.generate("What is the capital of France?", max_tokens=8)
    assert streamed == list(whole.tokens) and streamed


def test_early_break_close_and_garbage_collection_stop_the_run():
    gen = mixkv.Generator("tiny-swa")
    for _ in gen.stream("Hello", max_tokens=2000, buffer=0):
        break  # the dropped iterator stops the 2,000-token run at its next step
    it = gen.stream("Hello", max_tokens=2000, buffer=1)
    next(it)
    it.close()
    assert it.finished and it.generated < 2000
    assert list(it) == []  # a closed stream is exhausted
    with gen.stream("Hello", max_tokens=2000) as it:
        next(it)
    assert it.finished
    unread = gen.stream("Hello", max_tokens=2000, buffer=0)
    del unread
    gc.collect()
    # The engine still works after the abandoned runs.
    assert len(list(gen.stream("Hello", max_tokens=4))) == 4


def test_errors_propagate_as_mixkv_errors():
    with pytest.raises(mixkv.InvalidInput, match="unknown model 'no-such-model'"):
        next(mixkv.Generator("no-such-model").stream("Hello"))
    with pytest.raises(mixkv.InvalidInput, match="unknown drafter|drafter for"):
        list(mixkv.Generator("tiny-swa", draft="tiny-not-a-drafter").stream("Hello"))
    with pytest.raises(mixkv.Error):  # a prompt the cache cannot hold
        list(mixkv.Generator("tiny-swa", memory="64KiB").stream("Hello " * 400, max_tokens=2))
    with pytest.raises(mixkv.InvalidInput, match="num-spec-tokens"):
        mixkv.Generator("tiny-swa", num_spec_tokens=2).stream("Hello")
    with pytest.raises(mixkv.InvalidInput, match="empty"):
        mixkv.Generator("tiny-swa").stream([])
    with pytest.raises(mixkv.InvalidInput, match="buffer"):
        mixkv.Generator("tiny-swa").stream("Hello", buffer=-1)
