"""Frozen value types over the JSON documents of docs/plan-json.md and docs/model-file.md.

A value is its document: attributes are the document's keys (nested objects are values too,
lists are tuples), ``to_dict()`` gives the document back exactly as the CLI's ``--json`` prints
it, and ``from_dict()`` builds a value from such a document. Values compare by their document.
"""

from __future__ import annotations

import copy
import json
from typing import Any, Dict, Iterator, Mapping, Optional

from . import _core


def _wrap(value: Any) -> Any:
    if isinstance(value, dict):
        return Record(value)
    if isinstance(value, list):
        return tuple(_wrap(v) for v in value)
    return value


class Record:
    """A frozen, dict-backed value: ``r.key`` reads key ``key`` of its document."""

    __slots__ = ("_data",)

    def __init__(self, data: Mapping[str, Any]) -> None:
        if not isinstance(data, Mapping):
            raise _core.InvalidInput(
                f"{type(self).__name__} needs a dict, not {type(data).__name__}")
        object.__setattr__(self, "_data", dict(data))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]):
        """The value of document ``data`` (a deep copy: later changes to ``data`` do not show)."""
        if not isinstance(data, Mapping):
            raise _core.InvalidInput(
                f"{cls.__name__}.from_dict needs a dict, not {type(data).__name__}")
        return cls(copy.deepcopy(dict(data)))

    def to_dict(self) -> Dict[str, Any]:
        """The document, as the CLI's ``--json`` prints it (a deep copy)."""
        return copy.deepcopy(self._data)

    def to_json(self, indent: Optional[int] = 2) -> str:
        """The document as JSON text (keys sorted, as the CLI writes them)."""
        return json.dumps(self._data, indent=indent, sort_keys=True)

    def keys(self):
        """The document's keys (a value reads like a read-only mapping)."""
        return self._data.keys()

    def __getattr__(self, name: str) -> Any:
        try:
            return _wrap(self._data[name])
        except KeyError:
            raise AttributeError(
                f"{type(self).__name__} has no field '{name}'; its fields are "
                f"{', '.join(sorted(self._data))}") from None

    def __getitem__(self, key: str) -> Any:
        return _wrap(self._data[key])

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is frozen")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is frozen")

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(self._data))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Record):
            return NotImplemented
        return type(self) is type(other) and self._data == other._data

    def __hash__(self) -> int:
        return hash(json.dumps(self._data, sort_keys=True))

    def __repr__(self) -> str:
        keys = ", ".join(sorted(self._data))
        return f"{type(self).__name__}({keys})"

    def __getstate__(self):
        return self._data

    def __setstate__(self, state):
        object.__setattr__(self, "_data", state)


class ModelDesc(Record):
    """What every layer of a model and its drafter needs from the cache (``mixkv describe
    --json``, the native model file of docs/model-file.md): ``model``, ``draft``, ``tp``,
    ``num_spec_tokens``, ``facts`` and ``layers`` (name, kind, owner, heads, head sizes, dtype,
    window, chunk, soft cap, scale, sinks, causal, state tensors, bytes per token)."""


class Plan(Record):
    """A planned KV cache (``mixkv plan --json``, docs/plan-json.md): ``pools``,
    ``kv_cache_groups``, ``tensors``, ``attention_groups``, ``geometry``, ``concurrency``,
    ``waste_bytes``, ``waste_bytes_per_request``, ``warnings`` and the options it was planned
    with. A Plan from :func:`mixkv.plan` also holds the C++ plan a :class:`KvCacheManager` runs
    over; one from :meth:`from_dict` holds only the document."""

    __slots__ = ("_handle",)

    def __init__(self, data: Mapping[str, Any], handle: Any = None) -> None:
        super().__init__(data)
        object.__setattr__(self, "_handle", handle)

    def __getstate__(self):
        return self._data

    def __setstate__(self, state):
        object.__setattr__(self, "_data", state)
        object.__setattr__(self, "_handle", None)

    @property
    def memory_note(self) -> Optional[str]:
        """Where the KV memory came from (None for a Plan from from_dict)."""
        return None if self._handle is None else self._handle.memory_note

    @property
    def model(self) -> Optional[ModelDesc]:
        """The description it was planned from (None for a Plan from from_dict)."""
        if self._handle is None:
            return None
        return ModelDesc(json.loads(self._handle.model_json()))


class Comparison(Record):
    """Both policies on one model (``mixkv plan --compare --json``): ``vllm`` (a Plan, or None
    when the vllm policy fails, with ``vllm_error`` saying why) and ``mixkv``."""

    __slots__ = ("_plans",)

    def __init__(self, data: Mapping[str, Any], plans: Any = None) -> None:
        super().__init__(data)
        object.__setattr__(self, "_plans", plans or {})

    def __getattr__(self, name: str) -> Any:
        if name in ("vllm", "mixkv"):
            doc = self._data.get(name)
            if doc is None:
                return None
            return Plan(doc, self._plans.get(name))
        if name == "vllm_error":
            return self._data.get("vllm_error")
        return super().__getattr__(name)

    def __getstate__(self):
        return self._data

    def __setstate__(self, state):
        object.__setattr__(self, "_data", state)
        object.__setattr__(self, "_plans", {})


class VerifyReport(Record):
    """``mixkv verify --json``: the scaled-down plan that ran (``memory_bytes``,
    ``max_model_len``, ``bytes_allocated``), its ``requests`` and per-group results
    (``groups``: status pass / mismatch / skipped / not verified, errors and tolerances), and
    ``passed``."""


class Generation(Record):
    """One request of ``mixkv generate --json``: ``request``, ``tokens``, ``text`` and
    ``stats`` (prompt and generated tokens, prefix hits, preemptions, tokens per second; with a
    drafter also drafted and accepted tokens, acceptance rate, mean accepted length and
    ``identical_to_plain``)."""
