"""Bad input from Python raises mixkv.Error subclasses with the CLI's messages; nothing crashes."""

import itertools

import numpy as np
import pytest

import mixkv
from conftest import cli_error


def test_the_error_classes():
    assert issubclass(mixkv.InvalidInput, mixkv.Error) and issubclass(mixkv.InvalidInput, ValueError)
    assert issubclass(mixkv.CapacityError, mixkv.Error)
    assert issubclass(mixkv.InternalError, mixkv.Error)
    assert not issubclass(mixkv.CapacityError, mixkv.InvalidInput)


# (python call, CLI args giving the same error): the messages must be the CLI's.
SAME_AS_CLI = [
    (lambda: mixkv.describe("no-such-model"), ["describe", "no-such-model"]),
    (lambda: mixkv.describe("qwen3-8b", draft="nope"), ["describe", "qwen3-8b", "--draft", "nope"]),
    (lambda: mixkv.describe("qwen3-8b", kv_dtype="int3"), ["describe", "qwen3-8b", "--kv-dtype", "int3"]),
    (lambda: mixkv.describe("qwen3-8b", tp=3), ["describe", "qwen3-8b", "--tp", "3"]),
    (lambda: mixkv.describe("qwen3-8b", tp=0), ["describe", "qwen3-8b", "--tp", "0"]),
    (lambda: mixkv.describe("qwen3-8b", layer_kv_dtype=["x"]), ["describe", "qwen3-8b", "--layer-kv-dtype", "x"]),
    (lambda: mixkv.plan("qwen3-8b", backend="cuda9"), ["plan", "qwen3-8b", "--backend", "cuda9"]),
    (lambda: mixkv.plan("qwen3-8b", policy="best"), ["plan", "qwen3-8b", "--policy", "best"]),
    (lambda: mixkv.plan("qwen3-8b", gpu="tpu"), ["plan", "qwen3-8b", "--gpu", "tpu"]),
    (lambda: mixkv.plan("qwen3-8b", memory="lots"), ["plan", "qwen3-8b", "--memory", "lots"]),
    (lambda: mixkv.plan("qwen3-8b", memory="99999999999999EiB"), ["plan", "qwen3-8b", "--memory", "99999999999999EiB"]),
    (lambda: mixkv.plan("qwen3-8b", block_size=17), ["plan", "qwen3-8b", "--block-size", "17"]),
    (lambda: mixkv.plan("qwen3-8b", block_size=2**40), ["plan", "qwen3-8b", "--block-size", str(2**40)]),
    (lambda: mixkv.plan("qwen3-8b", max_model_len=0), ["plan", "qwen3-8b", "--max-model-len", "0"]),
    (lambda: mixkv.plan("qwen3-8b", request_len=10**9), ["plan", "qwen3-8b", "--request-len", str(10**9)]),
    (lambda: mixkv.plan("qwen3-8b", request_len=-4), ["plan", "qwen3-8b", "--request-len", "-4"]),
    (lambda: mixkv.plan("qwen3-8b", memory="1MiB"), ["plan", "qwen3-8b", "--memory", "1MiB"]),
    (lambda: mixkv.plan("llama-3.1-70b", gpu="h100"), ["plan", "llama-3.1-70b", "--gpu", "h100"]),
    (lambda: mixkv.verify("qwen3-8b", requests=0), ["verify", "qwen3-8b", "--requests", "0"]),
    (lambda: mixkv.verify("qwen3-8b", memory_scale="1KiB"), ["verify", "qwen3-8b", "--memory-scale", "1KiB"]),
    (lambda: mixkv.generate("no-such-tiny"), ["generate", "no-such-tiny"]),
    (lambda: mixkv.generate("tiny-swa", batch=10**6), ["generate", "tiny-swa", "--batch", str(10**6)]),
    (lambda: mixkv.generate("tiny-swa", max_tokens=0), ["generate", "tiny-swa", "--max-tokens", "0"]),
]


@pytest.mark.parametrize("call,args", SAME_AS_CLI, ids=[" ".join(a) for _, a in SAME_AS_CLI])
def test_errors_carry_the_clis_message(call, args):
    with pytest.raises(mixkv.Error) as e:
        call()
    assert str(e.value) == cli_error(args)


def test_memory_that_holds_no_request_is_a_capacity_error():
    with pytest.raises(mixkv.CapacityError, match="not even a one-token request fits"):
        mixkv.plan("qwen3-8b", memory="1MiB")
    with pytest.raises(mixkv.CapacityError, match="does not fit"):
        mixkv.plan("llama-3.1-70b", gpu="h100")  # the weights alone fill the GPU
    with pytest.raises(mixkv.InvalidInput):  # no memory would make this one plan
        mixkv.plan("qwen3-8b", memory="1MiB", block_size=17)


WRONG_TYPES = [
    lambda: mixkv.describe(42),
    lambda: mixkv.describe(None),
    lambda: mixkv.describe(["qwen3-8b"]),
    lambda: mixkv.describe("qwen3-8b", tp="2"),
    lambda: mixkv.describe("qwen3-8b", tp=2.0),
    lambda: mixkv.describe("qwen3-8b", tp=True),
    lambda: mixkv.describe("qwen3-8b", tp=2**80),
    lambda: mixkv.describe("qwen3-8b", num_spec_tokens=-1),
    lambda: mixkv.describe("qwen3-8b", num_spec_tokens=10**6),
    lambda: mixkv.describe("qwen3-8b", kv_dtype=None),
    lambda: mixkv.describe("qwen3-8b", layer_kv_dtype=5),
    lambda: mixkv.describe("qwen3-8b", draft=3.5),
    lambda: mixkv.describe("qwen3-8b\0"),
    lambda: mixkv.describe(""),
    lambda: mixkv.describe("/"),
    lambda: mixkv.describe("/dev/zero"),
    lambda: mixkv.describe({}),
    lambda: mixkv.describe({"model_type": "llama"}),
    lambda: mixkv.describe({"model_type": "unheard-of", "num_hidden_layers": 2}),
    lambda: mixkv.describe({"model_type": "llama", "num_hidden_layers": 10**12,
                            "hidden_size": 4096, "num_attention_heads": 32}),
    lambda: mixkv.describe({"model_type": "llama", "num_hidden_layers": -1,
                            "hidden_size": 4096, "num_attention_heads": 32}),
    lambda: mixkv.describe({"model_type": "llama", "num_hidden_layers": 2,
                            "hidden_size": 4096, "num_attention_heads": 0}),
    lambda: mixkv.describe({"a": float("nan")}),
    lambda: mixkv.describe({"a": object()}),
    lambda: mixkv.plan("qwen3-8b", memory=-1),
    lambda: mixkv.plan("qwen3-8b", memory=2**70),
    lambda: mixkv.plan("qwen3-8b", memory=[1]),
    lambda: mixkv.plan("qwen3-8b", gpu_memory_utilization="all"),
    lambda: mixkv.plan("qwen3-8b", gpu_memory_utilization=7.0),
    lambda: mixkv.plan("qwen3-8b", gpu_memory_utilization=-0.5),
    lambda: mixkv.plan("qwen3-8b", block_size=-16),
    lambda: mixkv.plan("qwen3-8b", max_num_batched_tokens=0),
    lambda: mixkv.plan("qwen3-8b", gpu="h100", memory="1GiB"),
    lambda: mixkv.compare("qwen3-8b", bogus=1),
    lambda: mixkv.verify("qwen3-8b", seed=-1),
    lambda: mixkv.verify("--help"),
    lambda: mixkv.verify("qwen3-8b", requests=10**9),
    lambda: mixkv.verify({"model_type": "llama"}),
    lambda: mixkv.generate("tiny-swa", prompt_ids=[]),
    lambda: mixkv.generate("tiny-swa", prompt_ids="abc"),
    lambda: mixkv.generate("tiny-swa", prompt_ids=[-5]),
    lambda: mixkv.generate("tiny-swa", prompt="x", prompt_ids=[1]),
    lambda: mixkv.generate("tiny-swa", draft="--json"),
    lambda: mixkv.generate("tiny-swa", num_spec_tokens=99, draft="oracle"),
    lambda: mixkv.generate("tiny-swa", memory="1B"),
    lambda: mixkv.generate("tiny-swa", draft="tiny-eagle", num_spec_tokens=2, memory=-3),
    lambda: mixkv.Generator(5),
    lambda: mixkv.KvCacheManager(None),
    lambda: mixkv.KvCacheManager(mixkv.plan("qwen3-8b", memory="1PiB", block_size=16)),
    lambda: mixkv.KvCacheManager("qwen3-8b"),
    lambda: mixkv.KvCacheManager(mixkv.Plan.from_dict({"pools": []})),
]


@pytest.mark.parametrize("call", WRONG_TYPES, ids=range(len(WRONG_TYPES)))
def test_wrong_types_unknown_names_and_absurd_sizes_raise_mixkv_errors(call):
    with pytest.raises(mixkv.Error) as e:
        call()
    assert str(e.value)  # a message, never empty


@pytest.fixture(scope="module")
def manager():
    plan = mixkv.plan("gpt-oss-20b", memory="64MiB", max_model_len=1024, request_len=512)
    m = mixkv.KvCacheManager(plan, num_spec_tokens=2)
    m.add_request(1, list(range(50)))
    assert m.admit(1, 2) is not None
    return m


MANAGER_CALLS = [
    lambda m: m.add_request(1, [1, 2]),  # already registered
    lambda m: m.add_request("1", [1]),
    lambda m: m.add_request(2**63, [1]),
    lambda m: m.add_request(5, "abc"),
    lambda m: m.add_request(5, [1.5]),
    lambda m: m.add_request(5, [-1]),
    lambda m: m.add_request(5, [2**40]),
    lambda m: m.add_request(5, None),
    lambda m: m.add_request(5, np.array([0.5, 1.5])),
    lambda m: m.add_request(5, [None]),
    lambda m: m.add_request(6, []),
    lambda m: m.add_request(6, itertools.count()),  # endless
    lambda m: m.add_request(6, (t for t in [1, 2, "x"])),
    lambda m: m.admit(99),
    lambda m: m.admit(1, -1),
    lambda m: m.admit(1, 10**6),
    lambda m: m.allocate(99, 1),
    lambda m: m.allocate(1, -1),
    lambda m: m.allocate(1, 2**40),
    lambda m: m.allocate(1, 1.0),
    lambda m: m.commit(1, 10**6, [1]),
    lambda m: m.commit(1, -1, [1]),
    lambda m: m.commit(1, 1, [1], accepted_drafts=-2),
    lambda m: m.commit(1, 1, [1], accepted_drafts=50),
    lambda m: m.commit(99, 1, [1]),
    lambda m: m.block_table(1, 99),
    lambda m: m.block_table(1, -1),
    lambda m: m.block_table(99, 0),
    lambda m: m.block_table(1, "0"),
    lambda m: m.slot_mapping(1, "no.such.layer", 0, 1),
    lambda m: m.slot_mapping(1, "layers.0", 0, 10**6),
    lambda m: m.slot_mapping(1, "layers.0", -1, 1),
    lambda m: m.slot_mapping(1, "layers.1", 0, 2**31 - 1),
    lambda m: m.slot_mapping(1, "layers.1", 2**62, 1),
    lambda m: m.recurrent_step(1, 0),
    lambda m: m.free(99),
    lambda m: m.num_computed(99),
    lambda m: m.find_prefix_hit(99),
]


@pytest.mark.parametrize("call", MANAGER_CALLS, ids=range(len(MANAGER_CALLS)))
def test_manager_refuses_bad_calls_and_stays_consistent(manager, call):
    before = (manager.num_used_blocks, manager.num_requests, manager.num_computed(1))
    with pytest.raises(mixkv.Error) as e:
        call(manager)
    assert str(e.value)
    assert manager.check_invariants() == ""
    assert (manager.num_used_blocks, manager.num_requests, manager.num_computed(1)) == before
