"""The package: version from one place, stubs, docstrings on every public name, the examples."""

import inspect
import os
import pathlib
import re
import subprocess
import sys

import mixkv

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "python" / "examples"


def test_version_is_the_cmake_projects():
    text = (ROOT / "CMakeLists.txt").read_text()
    assert re.search(r"project\(mixkv VERSION ([0-9.]+)", text).group(1) == mixkv.__version__


def test_the_extension_has_type_stubs():
    stub = pathlib.Path(mixkv._core.__file__).parent / "_core.pyi"
    text = stub.read_text()
    assert "class KvCacheManager" in text and "def block_table" in text
    assert (pathlib.Path(mixkv.__file__).parent / "py.typed").exists()


def test_every_public_name_has_a_docstring():
    for name in mixkv.__all__:
        if name == "__version__":
            continue
        obj = getattr(mixkv, name)
        assert inspect.getdoc(obj), name
        if inspect.isclass(obj):
            for attr, member in vars(obj).items():
                if not attr.startswith("_") and callable(member):
                    assert inspect.getdoc(member), f"{name}.{attr}"


def run(script, *args):
    return subprocess.run([sys.executable, str(EXAMPLES / script), *args], capture_output=True,
                          text=True, timeout=120)


def test_scheduler_loop_example_keeps_the_invariants():
    r = run("scheduler_loop.py", "--requests", "48", "--k", "4", "--steps", "400")
    assert r.returncode == 0, r.stderr
    assert "48 requests finished" in r.stdout and "invariants held at every step" in r.stdout


def test_deployment_fit_example_prints_the_table():
    r = run("deployment_fit.py", "qwen3.5-27b", "--draft", "dflash-qwen3.5-27b", "--gpus",
            "h100,b200", "--tp", "1,2")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert any(line.startswith("h100   1") and "does not fit" in line for line in lines)
    assert any(line.startswith("b200   2") for line in lines)
