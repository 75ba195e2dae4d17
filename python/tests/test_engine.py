"""verify and generate through the engine equal the CLI's JSON; Generator streams the tokens."""

import json

import mixkv
from conftest import SMALL_CONFIG, cli, cli_json


def test_verify_equals_cli_json(small_config_file):
    report = mixkv.verify(small_config_file, requests=3, seed=3, kv_dtype="fp8")
    expected = cli_json(["verify", small_config_file, "--requests", "3", "--seed", "3",
                         "--kv-dtype", "fp8", "--json"])
    assert report.to_dict() == expected
    assert report.passed and all(g.status == "pass" for g in report.groups)
    # A dict holding the same config verifies the same (only the file's name differs).
    from_dict = mixkv.verify(SMALL_CONFIG, requests=3, seed=3, kv_dtype="fp8").to_dict()
    assert {k: v for k, v in from_dict.items() if k != "model"} == {
        k: v for k, v in expected.items() if k != "model"}


def test_a_planted_fault_fails_the_report(small_config_file):
    code, out, err = cli(["verify", small_config_file, "--requests", "1", "--plant-fault",
                          "window", "--json"])
    assert code == 3 and json.loads(out)["passed"] is False


def test_generate_equals_cli_json_and_speculation_is_identical_to_plain():
    got = mixkv.generate("tiny-hybrid", "Once", draft="mtp", num_spec_tokens=2, max_tokens=12,
                         batch=2)
    code, out, err = cli(["generate", "tiny-hybrid", "--prompt", "Once", "--draft", "mtp",
                          "--num-spec-tokens", "2", "--max-tokens", "12", "--batch", "2", "--json"])
    assert code == 0, err
    expected = [json.loads(line) for line in out.splitlines()]
    assert len(got) == 2
    for g, e in zip(got, expected):
        assert g.tokens == tuple(e["tokens"]) and g.text == e["text"]
        assert len(g.tokens) == 12 and g.stats.identical_to_plain


def test_generator_streams_the_generated_tokens():
    gen = mixkv.Generator("tiny-swa", draft="oracle", num_spec_tokens=3)
    whole = gen.generate("Hello", max_tokens=10)
    streamed = list(gen.stream("Hello", max_tokens=10))
    assert streamed == list(whole.tokens) and len(streamed) == 10
    plain = mixkv.generate("tiny-swa", "Hello", max_tokens=10)[0]
    assert plain.tokens == whole.tokens
    ids = mixkv.Generator("tiny-swa").generate([72, 101], max_tokens=3)
    assert ids.stats.prompt_tokens == 2 and len(ids.tokens) == 3


def test_models_lists_the_builtins():
    names = [m["name"] for m in mixkv.models()]
    assert "qwen3.5-27b" in names and "dflash-qwen3.5-27b" in names
