"""describe / plan / compare from Python equal the CLI's --json for every built-in pair."""

import json

import pytest

import mixkv
from conftest import builtin_pairs, cli, cli_json, python_m_mixkv

PAIRS = builtin_pairs()


def flags(target, draft, **options):
    args = [target] + ([] if draft is None else ["--draft", draft])
    for k, v in options.items():
        args.append("--" + k.replace("_", "-"))
        args.append(v)
    return args


def test_there_are_pairs_with_and_without_drafters():
    assert any(d is None for _, d in PAIRS)
    assert sum(d is not None for _, d in PAIRS) >= 5


@pytest.mark.parametrize("target,draft", PAIRS)
def test_describe_equals_cli_json(target, draft):
    code, out, err = cli(["describe", *flags(target, draft), "--json"])
    if code != 0:  # smollm2-135m before `make deps` fetched its file
        with pytest.raises(mixkv.Error) as e:
            mixkv.describe(target, draft=draft)
        assert str(e.value) == err.strip().removeprefix("mixkv: error: ")
        return
    desc = mixkv.describe(target, draft=draft)
    assert desc.to_dict() == json.loads(out)
    assert desc.model == target
    assert len(desc.layers) == len(desc.to_dict()["layers"]) > 0


# Each pair on an H200 at TP 2 (weights subtracted) and in a fixed 40 GiB; a plan that fails
# must fail in Python with the CLI's message.
@pytest.mark.parametrize("target,draft", PAIRS)
@pytest.mark.parametrize("options", [dict(gpu="h200", tp=2), dict(memory="40GiB")])
def test_plan_equals_cli_json(target, draft, options):
    code, out, err = cli(["plan", *flags(target, draft, **options), "--json"])
    if code != 0:
        with pytest.raises(mixkv.Error) as e:
            mixkv.plan(target, draft=draft, **options)
        assert str(e.value) == err.strip().removeprefix("mixkv: error: ")
        return
    plan = mixkv.plan(target, draft=draft, **options)
    assert plan.to_dict() == json.loads(out)
    # The value's fields are the document's keys.
    assert plan.concurrency.max_requests == json.loads(out)["concurrency"]["max_requests"]
    assert len(plan.attention_groups) == len(json.loads(out)["attention_groups"])


@pytest.mark.parametrize("target,draft", PAIRS)
def test_compare_equals_cli_json(target, draft):
    expected = cli_json(["plan", *flags(target, draft, memory="60GiB"), "--compare", "--json"])
    got = mixkv.compare(target, draft=draft, memory="60GiB")
    assert got.to_dict() == expected
    assert got.mixkv.to_dict() == expected["mixkv"]
    if expected["vllm"] is None:
        assert got.vllm is None and got.vllm_error == expected["vllm_error"]
    else:
        assert got.vllm.to_dict() == expected["vllm"]
        assert got.mixkv.concurrency.max_requests >= got.vllm.concurrency.max_requests


def test_every_plan_option_reaches_the_planner():
    options = dict(tp=2, num_spec_tokens=4, kv_dtype="fp8", memory=20 << 30, block_size=32,
                   backend="flashinfer", max_model_len=65536, request_len=4000, policy="vllm",
                   max_num_batched_tokens=4096, gpu_memory_utilization=0.8)
    cli_options = {k: v for k, v in options.items() if k != "gpu_memory_utilization"}
    expected = cli_json(["plan", *flags("qwen3.5-27b", "dflash-qwen3.5-27b", **cli_options),
                         "--json"])
    assert mixkv.plan("qwen3.5-27b", "dflash-qwen3.5-27b", **options).to_dict() == expected


def test_plan_of_a_model_desc_and_of_a_config_dict_equal_the_named_model():
    desc = mixkv.describe("gemma-2-9b", tp=2)
    by_name = mixkv.plan("gemma-2-9b", tp=2, memory="10GiB")
    assert mixkv.plan(desc, memory="10GiB").to_dict() == by_name.to_dict()
    # A ModelDesc round-trips through its dict (the native model file).
    assert mixkv.describe(desc.to_dict()) == desc
    assert mixkv.ModelDesc.from_dict(desc.to_dict()) == desc


def test_python_m_mixkv_is_the_command_line():
    run = python_m_mixkv(["plan", "qwen3-8b", "--draft", "dflash-qwen3-8b-b16", "--json"])
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == mixkv.plan("qwen3-8b", "dflash-qwen3-8b-b16").to_dict()
    version = python_m_mixkv(["--version"])
    assert version.returncode == 0 and version.stdout.split() == ["mixkv", mixkv.__version__]
    bad = python_m_mixkv(["plan", "no-such-model"])
    assert bad.returncode == 2 and "unknown model 'no-such-model'" in bad.stderr
