"""mixkv: KV-cache planning and management for mixed-layer LLMs with speculative drafters.

The Python face of the C++ library (docs/python.md)::

    import mixkv
    plan = mixkv.plan("qwen3.5-27b", draft="dflash-qwen3.5-27b", tp=2, gpu="h200")
    print(plan.concurrency.at_request_len)
    manager = mixkv.KvCacheManager(plan, num_spec_tokens=3)

Options are keyword arguments named like the CLI's flags (``--request-len`` is
``request_len``); results are frozen values whose ``to_dict()`` is the CLI's ``--json``; errors
are :class:`Error` subclasses carrying the CLI's messages.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from . import _core
from ._core import CapacityError, Error, InternalError, InvalidInput, KvCacheManager
from ._values import Comparison, Generation, ModelDesc, Plan, Record, VerifyReport

__version__: str = getattr(_core, "__version__", "0.0.0")

__all__ = [
    "CapacityError", "Comparison", "Error", "Generation", "Generator", "InternalError",
    "InvalidInput", "KvCacheManager", "ModelDesc", "Plan", "Record", "VerifyReport",
    "compare", "describe", "generate", "main", "models", "plan", "verify", "__version__",
]

ModelLike = Union[str, os.PathLike, Mapping[str, Any], ModelDesc]

# ---- argument checks: a wrong type is InvalidInput naming the argument and its CLI flag ----


def _fail(name: str, expected: str, value: Any) -> None:
    flag = "--" + name.replace("_", "-")
    raise InvalidInput(
        f"{name} ({flag}) must be {expected}, not {type(value).__name__} {value!r:.60}")


def _int(name: str, value: Any, optional: bool = True) -> Optional[int]:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            import numpy as _np  # NumPy integers are ints too
            if isinstance(value, _np.integer):
                return int(value)
        except ImportError:  # pragma: no cover
            pass
        _fail(name, "an int", value)
    if not -(2**63) <= value < 2**63:
        raise InvalidInput(f"{name} (--{name.replace('_', '-')}) {value} is out of range")
    return value


def _str(name: str, value: Any, optional: bool = True) -> Optional[str]:
    if value is None and optional:
        return None
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):
        _fail(name, "a str", value)
    if "\0" in value:
        raise InvalidInput(f"{name} (--{name.replace('_', '-')}) holds a NUL character")
    return value


def _float(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        _fail(name, "a number", value)
    return float(value)


def _memory(name: str, value: Any) -> str:
    """A memory size: bytes as an int, or text such as '40GiB'."""
    if value is None:
        return ""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return _str(name, value) or ""


def _model(name: str, value: Any) -> Tuple[str, Optional[str]]:
    """(reference, JSON text of a document or None) for a name, path, dict or ModelDesc."""
    if isinstance(value, Record):
        return ("", json.dumps(value.to_dict()))
    if isinstance(value, Mapping):
        try:
            return ("", json.dumps(dict(value)))
        except (TypeError, ValueError) as e:
            raise InvalidInput(f"{name}: the dict is not a JSON document: {e}") from None
    text = _str(name, value, optional=False)
    return (text, None)


def _describe_kwargs(model: ModelLike, draft: Optional[ModelLike], tp, num_spec_tokens, kv_dtype,
                     draft_kv_dtype, ssm_dtype, layer_kv_dtype) -> Dict[str, Any]:
    model_ref, model_json = _model("model", model)
    draft_ref, draft_json = (None, None) if draft is None else _model("draft", draft)
    if isinstance(layer_kv_dtype, str):
        layer_kv_dtype = [layer_kv_dtype]
    if not isinstance(layer_kv_dtype, (list, tuple)):
        _fail("layer_kv_dtype", "a list of 'NAME=DTYPE' strings", layer_kv_dtype)
    tp = _int("tp", tp)
    spec = _int("num_spec_tokens", num_spec_tokens)
    for name, v in (("tp", tp), ("num_spec_tokens", spec)):
        if v is not None and not -(2**31) <= v < 2**31:
            raise InvalidInput(f"{name} (--{name.replace('_', '-')}) {v} is out of range")
    return dict(
        model=model_ref, model_json=model_json, draft=draft_ref, draft_json=draft_json,
        tp=tp, num_spec_tokens=spec,
        kv_dtype=_str("kv_dtype", kv_dtype, optional=False),
        draft_kv_dtype=_str("draft_kv_dtype", draft_kv_dtype) or "",
        ssm_dtype=_str("ssm_dtype", ssm_dtype, optional=False),
        layer_kv_dtype=[_str("layer_kv_dtype", t, optional=False) for t in layer_kv_dtype])


def describe(model: ModelLike, draft: Optional[ModelLike] = None, *, tp: Optional[int] = None,
             num_spec_tokens: Optional[int] = None, kv_dtype: str = "auto",
             draft_kv_dtype: Optional[str] = None, ssm_dtype: str = "auto",
             layer_kv_dtype: Sequence[str] = ()) -> ModelDesc:
    """What every layer of ``model`` (and of ``draft``) needs from the KV cache, per TP rank.

    ``model`` and ``draft``: a built-in name (see :func:`models`), a path to a config.json (or
    its directory), a GGUF file or a native model file, or a ``dict`` holding a config;
    ``draft`` may also be ``"mtp"`` (the target's own MTP layers). The other options are
    ``mixkv describe``'s flags. Equal to ``mixkv describe --json``; the GIL is released.
    """
    kwargs = _describe_kwargs(model, draft, tp, num_spec_tokens, kv_dtype, draft_kv_dtype,
                              ssm_dtype, layer_kv_dtype)
    return ModelDesc(json.loads(_core.describe_json(**kwargs)))


def _plan_call(model, draft, tp, num_spec_tokens, kv_dtype, draft_kv_dtype, ssm_dtype,
               layer_kv_dtype, memory, gpu, gpu_memory_utilization, block_size, backend,
               max_model_len, request_len, policy, max_num_batched_tokens, compare):
    kwargs = _describe_kwargs(model, draft, tp, num_spec_tokens, kv_dtype, draft_kv_dtype,
                              ssm_dtype, layer_kv_dtype)
    if max_num_batched_tokens is None:
        max_num_batched_tokens = _core.DEFAULT_MAX_NUM_BATCHED_TOKENS
    return _core.plan(
        **kwargs, memory=_memory("memory", memory), gpu=_str("gpu", gpu) or "",
        gpu_memory_utilization=_float("gpu_memory_utilization", gpu_memory_utilization),
        block_size=_int("block_size", block_size), backend=_str("backend", backend, False),
        max_model_len=_int("max_model_len", max_model_len),
        request_len=_int("request_len", request_len, False), policy=_str("policy", policy, False),
        max_num_batched_tokens=_int("max_num_batched_tokens", max_num_batched_tokens, False),
        compare=compare)


def plan(model: ModelLike, draft: Optional[ModelLike] = None, *, tp: Optional[int] = None,
         num_spec_tokens: Optional[int] = None, kv_dtype: str = "auto",
         draft_kv_dtype: Optional[str] = None, ssm_dtype: str = "auto",
         layer_kv_dtype: Sequence[str] = (), memory: Union[str, int, None] = None,
         gpu: Optional[str] = None, gpu_memory_utilization: float = 0.9,
         block_size: Optional[int] = None, backend: str = "flashinfer",
         max_model_len: Optional[int] = None, request_len: int = 2500, policy: str = "mixkv",
         max_num_batched_tokens: Optional[int] = None) -> Plan:
    """Plans the KV cache of ``model`` (a name, path, dict, or a :class:`ModelDesc`) for a
    memory budget: ``memory`` (bytes per rank, an int or text like ``"40GiB"``) or ``gpu``
    (``h100``, ``h200``, ``b200``, ``b300``: its memory times ``gpu_memory_utilization`` minus
    the estimated weights; the default is ``gpu="h100"``). The other options are ``mixkv
    plan``'s flags. ``to_dict()`` equals ``mixkv plan --json``. Raises :class:`CapacityError`
    when the options are valid but the memory holds no request of ``max_model_len``. The GIL is
    released while it plans."""
    handle, _, _ = _plan_call(model, draft, tp, num_spec_tokens, kv_dtype, draft_kv_dtype,
                              ssm_dtype, layer_kv_dtype, memory, gpu, gpu_memory_utilization,
                              block_size, backend, max_model_len, request_len, policy,
                              max_num_batched_tokens, False)
    return Plan(json.loads(handle.to_json()), handle)


def compare(model: ModelLike, draft: Optional[ModelLike] = None, **options: Any) -> Comparison:
    """Plans with both policies (``mixkv plan --compare --json``): the same options as
    :func:`plan` (``policy`` is ignored). ``vllm`` is None where the vllm policy fails, and
    ``vllm_error`` says why."""
    options.pop("policy", None)
    unknown = set(options) - _PLAN_OPTIONS
    if unknown:
        raise InvalidInput(f"compare() got unknown options {sorted(unknown)}; "
                           f"the options are {sorted(_PLAN_OPTIONS)}")
    args = {**_PLAN_DEFAULTS, **options}
    mixkv_h, vllm_h, vllm_error = _plan_call(model, draft, compare=True, policy="mixkv", **args)
    doc: Dict[str, Any] = {
        "vllm": None if vllm_h is None else json.loads(vllm_h.to_json()),
        "mixkv": json.loads(mixkv_h.to_json()),
    }
    if vllm_h is None:
        doc["vllm_error"] = vllm_error
    return Comparison(doc, {"vllm": vllm_h, "mixkv": mixkv_h})


_PLAN_DEFAULTS: Dict[str, Any] = dict(
    tp=None, num_spec_tokens=None, kv_dtype="auto", draft_kv_dtype=None, ssm_dtype="auto",
    layer_kv_dtype=(), memory=None, gpu=None, gpu_memory_utilization=0.9, block_size=None,
    backend="flashinfer", max_model_len=None, request_len=2500, max_num_batched_tokens=None)
_PLAN_OPTIONS = set(_PLAN_DEFAULTS)

# ---- commands run through the CLI in process (verify, generate, models) ----


def _cli(args: List[str]) -> str:
    """Runs the CLI in process (GIL released): its stdout, or its error as an Error subclass."""
    code, out, err = _core.run_cli(args)
    if code in (0, 3):
        return out
    message = err.strip()
    for prefix in ("mixkv: error: ", "mixkv: internal error: ", "mixkv: "):
        if message.startswith(prefix):
            message = message[len(prefix):]
            break
    message = message.replace("\nRun 'mixkv --help' for usage.", "")
    raise (InternalError if code == 1 else InvalidInput)(message)


def _flag(args: List[str], name: str, value: Any) -> None:
    if value is None:
        return
    if isinstance(value, bool):
        if value:
            args.append("--" + name.replace("_", "-"))
        return
    args.append(f"--{name.replace('_', '-')}={value}")


def _positional(name: str, value: str) -> str:
    if value.startswith("-"):
        raise InvalidInput(f"{name} '{value}' is not a model: a name or a path, not a flag")
    return value


class _ModelFiles:
    """Model references for the CLI: dicts and ModelDescs written to a private temporary file."""

    def __init__(self) -> None:
        self._dir: Optional[tempfile.TemporaryDirectory] = None

    def ref(self, name: str, value: Any) -> str:
        ref, doc = _model(name, value)
        if doc is None:
            return _positional(name, ref)
        if self._dir is None:
            self._dir = tempfile.TemporaryDirectory(prefix="mixkv-")
        path = os.path.join(self._dir.name, f"{name}.json")
        with open(path, "w", encoding="utf-8") as f:
            f.write(doc)
        return path

    def __enter__(self) -> "_ModelFiles":
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._dir is not None:
            self._dir.cleanup()


def verify(model: ModelLike, draft: Optional[ModelLike] = None, *, tp: Optional[int] = None,
           num_spec_tokens: Optional[int] = None, kv_dtype: str = "auto",
           draft_kv_dtype: Optional[str] = None, ssm_dtype: str = "auto",
           layer_kv_dtype: Sequence[str] = (), block_size: Optional[int] = None,
           backend: str = "flashinfer", max_model_len: Optional[int] = None,
           request_len: int = 2500, policy: str = "mixkv",
           memory_scale: Union[str, int, None] = None, requests: int = 4,
           seed: int = 1) -> VerifyReport:
    """Runs the plan's attention and recurrent kernels over a scaled-down cache and compares
    them with dense references (``mixkv verify --json``; docs/kernels.md). ``report.passed``
    is False when a group mismatches. The GIL is released while it runs."""
    if isinstance(layer_kv_dtype, str):
        layer_kv_dtype = [layer_kv_dtype]
    with _ModelFiles() as files:
        args = ["verify", files.ref("model", model)]
        if draft is not None:
            _flag(args, "draft", files.ref("draft", draft) if not draft == "mtp" else "mtp")
        _flag(args, "tp", _int("tp", tp))
        _flag(args, "num_spec_tokens", _int("num_spec_tokens", num_spec_tokens))
        _flag(args, "kv_dtype", _str("kv_dtype", kv_dtype, False))
        _flag(args, "draft_kv_dtype", _str("draft_kv_dtype", draft_kv_dtype))
        _flag(args, "ssm_dtype", _str("ssm_dtype", ssm_dtype, False))
        for text in layer_kv_dtype:
            _flag(args, "layer_kv_dtype", _str("layer_kv_dtype", text, False))
        _flag(args, "block_size", _int("block_size", block_size))
        _flag(args, "backend", _str("backend", backend, False))
        _flag(args, "max_model_len", _int("max_model_len", max_model_len))
        _flag(args, "request_len", _int("request_len", request_len, False))
        _flag(args, "policy", _str("policy", policy, False))
        _flag(args, "memory_scale", _memory("memory_scale", memory_scale) or None)
        _flag(args, "requests", _int("requests", requests, False))
        seed = _int("seed", seed, False)
        if seed < 0:
            raise InvalidInput(f"seed (--seed) {seed} is negative; give an int from 0 to 2^64 - 1")
        _flag(args, "seed", seed)
        args.append("--json")
        return VerifyReport(json.loads(_cli(args)))


def generate(model: str, prompt: Optional[str] = None, *, prompt_ids: Optional[Sequence[int]] = None,
             draft: Optional[str] = None, num_spec_tokens: Optional[int] = None,
             max_tokens: int = 32, batch: int = 1, seed: int = 0,
             memory: Union[str, int] = "64MiB") -> List[Generation]:
    """Greedy generation through the reference engine (``mixkv generate --json``): ``model`` is
    an engine model (``tiny-swa``, ``tiny-hybrid``, ..., or what the engine serves by name) or a
    checkpoint directory; ``draft`` a drafter (``oracle``, ``ngram``, ``random``, ``mtp``, a tiny
    drafter or a checkpoint directory). With a drafter, the prompts run twice, plain and
    speculative, and each result's ``stats.identical_to_plain`` says whether the tokens agree.
    One :class:`Generation` per request; the GIL is released while it runs."""
    args = ["generate", _positional("model", _str("model", model, False))]
    if prompt is not None and prompt_ids is not None:
        raise InvalidInput("give prompt or prompt_ids (--prompt, --prompt-ids), not both")
    _flag(args, "prompt", _str("prompt", prompt))
    if prompt_ids is not None:
        if isinstance(prompt_ids, (str, bytes)) or not hasattr(prompt_ids, "__iter__"):
            _fail("prompt_ids", "a sequence of ints", prompt_ids)
        ids = [_int("prompt_ids", t, False) for t in prompt_ids]
        if not ids:
            raise InvalidInput("prompt_ids (--prompt-ids) is empty; give at least one token id")
        args.append("--prompt-ids")
        args.extend(str(t) for t in ids)
    _flag(args, "draft", None if draft is None else _positional("draft", _str("draft", draft)))
    _flag(args, "num_spec_tokens", _int("num_spec_tokens", num_spec_tokens))
    _flag(args, "max_tokens", _int("max_tokens", max_tokens, False))
    _flag(args, "batch", _int("batch", batch, False))
    seed = _int("seed", seed, False)
    if seed < 0:
        raise InvalidInput(f"seed (--seed) {seed} is negative; give an int from 0 to 2^64 - 1")
    _flag(args, "seed", seed)
    _flag(args, "memory", _memory("memory", memory))
    args.append("--json")
    out = _cli(args)
    return [Generation(json.loads(line)) for line in out.splitlines() if line.strip()]


class Generator:
    """An engine model (and drafter) to generate from repeatedly::

        gen = mixkv.Generator("tiny-hybrid", draft="mtp", num_spec_tokens=2)
        for token in gen.stream("Once upon a time", max_tokens=16):
            ...

    ``generate`` runs :func:`generate` with these settings. ``stream`` yields each token id as
    the engine commits it (one per step, or a step's accepted draft tokens one by one), from a
    C++ thread; its tokens equal ``generate``'s (with a drafter, only the speculative run is
    made).
    """

    def __init__(self, model: str, draft: Optional[str] = None, *,
                 num_spec_tokens: Optional[int] = None, memory: Union[str, int] = "64MiB",
                 seed: int = 0) -> None:
        self.model = _str("model", model, False)
        self.draft = _str("draft", draft)
        self.num_spec_tokens = _int("num_spec_tokens", num_spec_tokens)
        self.memory = memory
        self.seed = seed

    def generate(self, prompt: Union[str, Sequence[int]], max_tokens: int = 32) -> Generation:
        """One request: its tokens, text and stats."""
        if isinstance(prompt, str):
            text, ids = prompt, None
        else:
            text, ids = None, prompt
        (out,) = generate(self.model, text, prompt_ids=ids, draft=self.draft,
                          num_spec_tokens=self.num_spec_tokens, max_tokens=max_tokens,
                          seed=self.seed, memory=self.memory)
        return out

    def stream(self, prompt: Union[str, Sequence[int]], max_tokens: int = 32, *,
               buffer: int = 64) -> "_TokenIterator":
        """The generated token ids of one request, yielded as the engine commits them.

        The request runs on a C++ thread (no GIL) as ``mixkv generate`` runs it (a GGUF model's
        chat template and end-of-turn tokens; a tiny model's bytes); the engine runs at most one
        step plus ``buffer`` unread tokens ahead of the reader. Errors (an unknown model, a
        prompt too long for the cache) come from the first ``next()`` as :class:`Error`
        subclasses. Breaking out of the loop, ``close()`` or dropping the iterator stops the
        generation at its next step; ``with gen.stream(...) as it:`` closes it on exit. The
        iterator's ``generated`` counts the tokens committed so far, ``finished`` says whether
        the run has ended."""
        if isinstance(prompt, str):
            if not prompt:
                raise InvalidInput("prompt (--prompt) is empty; give some text or token ids")
            text, ids = _str("prompt", prompt, False), []
        else:
            if isinstance(prompt, bytes) or not hasattr(prompt, "__iter__"):
                _fail("prompt", "a str or a sequence of ints", prompt)
            text, ids = "", [_int("prompt_ids", t, False) for t in prompt]
            if not ids:
                raise InvalidInput("prompt_ids (--prompt-ids) is empty; give at least one token id")
        if self.num_spec_tokens is not None and self.draft is None:
            raise InvalidInput(
                f"--num-spec-tokens {self.num_spec_tokens} needs a drafter: add --draft (oracle, "
                "ngram, random, mtp, a tiny drafter or a checkpoint directory), or drop "
                "--num-spec-tokens")
        seed = _int("seed", self.seed, False)
        if seed < 0:
            raise InvalidInput(f"seed (--seed) {seed} is negative; give an int from 0 to 2^64 - 1")
        spec = 3 if self.num_spec_tokens is None else self.num_spec_tokens
        if not -(2**31) <= spec < 2**31:
            raise InvalidInput(f"num_spec_tokens (--num-spec-tokens) {spec} is out of range")
        model = _positional("model", self.model)
        draft = "" if self.draft is None else _positional("draft", self.draft)
        return _TokenIterator(_core.TokenStream(
            model=model, draft=draft, num_spec_tokens=spec, prompt=text, prompt_ids=ids,
            max_tokens=_int("max_tokens", max_tokens, False), seed=seed,
            memory=_memory("memory", self.memory), buffer=_int("buffer", buffer, False)))

    __call__ = generate

    def __repr__(self) -> str:
        return f"Generator({self.model!r}, draft={self.draft!r})"


class _TokenIterator:
    """Generator.stream's iterator: the C++ stream, closed on exit from a ``with`` block."""

    __slots__ = ("_stream",)

    def __init__(self, stream: "_core.TokenStream") -> None:
        self._stream = stream

    def __iter__(self) -> "_TokenIterator":
        return self

    def __next__(self) -> int:
        return self._stream.__next__()

    def close(self) -> None:
        """Stops the generation at its next step and waits for its thread."""
        self._stream.close()

    @property
    def generated(self) -> int:
        """Tokens the engine has committed so far (read or not)."""
        return self._stream.generated

    @property
    def finished(self) -> bool:
        """Whether the run has ended (done, failed or closed)."""
        return self._stream.finished

    def __enter__(self) -> "_TokenIterator":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def models() -> List[Dict[str, Any]]:
    """The built-in models (``mixkv models --json``): name, role, summary, drafters."""
    return json.loads(_cli(["models", "--json"]))


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The ``mixkv`` command line (``python -m mixkv``); returns its exit status."""
    import sys
    args = list(sys.argv[1:] if argv is None else argv)
    sys.stdout.flush()
    return _core.main(args)
