"""A run's checkpointed state as a table of stateful parts, and meta.json's summary of it.

A part is anything with ``state_dict()`` / ``load_state_dict(state)`` (torchtitan's ``Stateful``). The
trainer owns the table (:mod:`llmtools.train.state`); this module only merges and splits it:
:meth:`RunState.state_dict` is the client state DeepSpeed pickles into the model-states file (every part
adds its own top-level entries; two parts never own the same entry), :meth:`RunState.load_state_dict`
hands each part the client state a checkpoint returned, and :meth:`RunState.summary` is meta.json's
summary (:func:`summarize`, plus what a part adds with a ``summary()`` of its own).

The checkpoint's header entries, which every checkpoint's client state carries and every ``llm-ckpt``
tool reads back from meta.json (its progress and what it is a checkpoint of), are this module's: the
manager summarises any client state by them, also a bare dict (tests, benchmarks). What else the
trainer keeps is opaque here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from llmtools.errors import UsageError


def _anchored(identity: Any) -> Any:
    """The tokenizer identity with its source made absolute: a relative source means the folder the run
    was started in, which a later reader (``llm-ckpt eval`` from elsewhere) cannot know."""
    if not isinstance(identity, Mapping) or not isinstance(identity.get("source"), str):
        return identity
    import os

    source = identity["source"]
    if source == "byte" or os.path.isabs(source) or not os.path.exists(source):
        return identity
    return {**identity, "source": os.path.abspath(source)}


class Stateful(Protocol):
    """A checkpointed part of a run."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def summarize(client_state: Mapping[str, Any]) -> dict[str, Any]:
    """meta.json's summary of a client state's header entries (readable without torch: resume checks,
    ``llm-ckpt inspect``); the one place that says which header entry becomes which meta.json field."""
    return {
        "consumed_samples": client_state.get("consumed_samples"),
        "consumed_tokens": client_state.get("consumed_tokens"),
        "data": {
            "consumed_samples": client_state.get("consumed_samples"),
            "fingerprint": client_state.get("data_fingerprint"),
            "ledger": None,  # a part of the trainer's adds it (per-source cursors)
        },
        "config_hash": client_state.get("config_hash"),
        "config": client_state.get("config"),  # what a resume compares its config with
        "model": client_state.get("model"),
        "tokenizer": _anchored(client_state.get("tokenizer")),
        "expert_parallel": client_state.get("expert_parallel"),
    }


def _merge(into: dict[str, Any], extra: Mapping[str, Any]) -> None:
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


class RunState:
    """The parts of a run, by name, in the order their entries are saved."""

    def __init__(self, parts: Mapping[str, Stateful]) -> None:
        self.parts = dict(parts)

    def state_dict(self) -> dict[str, Any]:
        """The client state: every part's entries, in the table's order."""
        merged: dict[str, Any] = {}
        for name, part in self.parts.items():
            entries = part.state_dict()
            clash = sorted(set(entries) & set(merged))
            if clash:
                raise UsageError(f"checkpoint part {name!r}: entry {clash[0]!r} is another part's")
            merged.update(entries)
        return merged

    def load_state_dict(self, client_state: Mapping[str, Any]) -> None:
        """Every part takes its entries back from a checkpoint's client state, in the table's order."""
        for part in self.parts.values():
            part.load_state_dict(dict(client_state))

    def summary(self, client_state: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """meta.json's summary of ``client_state`` (default: this state's): the header's fields, and what each
        part's own ``summary(client_state)`` adds, where it has one."""
        client_state = self.state_dict() if client_state is None else client_state
        found = summarize(client_state)
        for part in self.parts.values():
            extra = getattr(part, "summary", None)
            if extra is not None:
                _merge(found, extra(client_state))
        return found


def saved_state(state: RunState | Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(client state, meta.json summary) of what a save is handed: a run's parts, or a bare client state."""
    if isinstance(state, RunState):
        client_state = state.state_dict()
        return client_state, state.summary(client_state)
    return dict(state), summarize(state)
