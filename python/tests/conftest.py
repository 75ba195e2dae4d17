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
