"""Shared helpers: the CLI's own JSON for a command, run through the CLI's entry point."""

import json
import os
import subprocess
import sys

import pytest

import mixkv
from mixkv import _core


def cli(args):
    """(exit status, stdout, stderr) of `mixkv ARGS` run in process (cli::run, as main does)."""
    return _core.run_cli([str(a) for a in args])


def cli_json(args):
    code, out, err = cli(args)
    assert code == 0, err
    return json.loads(out)


def cli_error(args):
    """The CLI's error message for ARGS, as the Python exception carries it."""
    code, out, err = cli(args)
    assert code == 2, (code, out, err)
    return err.strip().removeprefix("mixkv: error: ")


def python_m_mixkv(args):
    """`python -m mixkv ARGS` as a subprocess: the real command line of the installed package."""
    return subprocess.run([sys.executable, "-m", "mixkv", *map(str, args)], capture_output=True,
                          text=True, timeout=120)


def builtin_pairs():
    """Every built-in target alone and with each of its drafters (`mixkv models`)."""
    pairs = []
    for m in mixkv.models():
        if m["role"] != "target":
            continue
        pairs.append((m["name"], None))
        pairs.extend((m["name"], d) for d in m.get("drafters", []))
    return pairs


@pytest.fixture(scope="session")
def pairs():
    return builtin_pairs()


# A small sliding-window model (two layers): verify runs it in a fraction of a second.
SMALL_CONFIG = {
    "model_type": "mistral", "num_hidden_layers": 2, "hidden_size": 256,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
    "max_position_embeddings": 2048, "intermediate_size": 512, "vocab_size": 1000,
    "torch_dtype": "bfloat16", "sliding_window": 128,
}


@pytest.fixture
def small_config_file(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(SMALL_CONFIG))
    return path
