"""The train data a run reads from its resumed position on, and the ledger it keeps while reading.

:class:`RunData` is what :func:`llmtools.data.reconcile.open_run_data` returns: the trainer reads it by
global sample position; it counts, per source, what each position drew (the ledger a checkpoint saves,
:mod:`llmtools.data.ledger`) and the tokens consumed for metrics.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace

import numpy as np

from llmtools.data.ledger import FORMAT, MAX_PASSED_OVER, VERSION, SourceRecord
from llmtools.data.stages import Built, Stage
from llmtools.data.streams import SourceStream
from llmtools.data.train_streams import TrainStreams

MAX_SOURCES_LOGGED = 100
"""More sources than this: metrics.jsonl gets the tokens per folder, not per source."""


def folder_names(prefixes: dict[str, str]) -> dict[str, str]:
    """A short name per source's folder: its last component (``web/``), or the whole folder where two
    folders share a last component."""
    folders = {key: os.path.dirname(os.path.normpath(prefix)) for key, prefix in prefixes.items()}
    short = {folder: (os.path.basename(folder) or folder or ".") + "/" for folder in set(folders.values())}
    seen: dict[str, int] = {}
    for name in short.values():
        seen[name] = seen.get(name, 0) + 1
    clash = {name for name, n in seen.items() if n > 1}
    return {key: short[f] if short[f] not in clash else (f or ".") + "/" for key, f in folders.items()}


@dataclass
class Report:
    """What :func:`open_run_data` decided, for stderr and a metrics event."""

    kind: str  # fresh | same | continued | reset
    lines: list[str] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)  # name -> continues | starts | stops
    quarantine: dict[str, int] = field(default_factory=dict)  # name -> documents newly quarantined


class RunData:
    """The train data of a run from its resumed position on, with the ledger (see the module docstring).

    The trainer reads it by global sample position (``batch(indices)``, as the sampler hands them out);
    ``len()`` is the position where its data ends.
    """

    def __init__(
        self,
        plan: TrainStreams,
        streams: dict[str, SourceStream],
        built: Built,
        dataset,
        sources: dict[str, SourceRecord],
        history: list[Stage],
        resumed_at: int,
        plan_base: int,
        run: str | None,
        resets: list[dict],
    ) -> None:
        self.plan = plan
        self.streams = streams
        self.built = built
        self.dataset = dataset
        self.sources = sources
        self.history = history
        self.resumed_at = resumed_at
        self.plan_base = plan_base
        self.run = run
        self.resets = resets
        self.seq_length = plan.seq_length
        self.tokenizer = plan.tokenizer
        self.vocab_size = plan.vocab_size
        self.fingerprint = f"{plan.identity}-train"
        """The plan the run now reads (a checkpoint's config records it: ``data.plan``)."""
        self.base = built.base
        order = list(sources)
        self._index = {key: i for i, key in enumerate(order)}
        self._part_source = np.asarray([self._index[key] for key, _ in built.parts] or [0], dtype=np.int64)
        self._counted = (resumed_at, np.zeros(len(order), dtype=np.int64))
        self._folders: dict[str, str] | None = None  # folder name per source (metrics of many sources)

    # -- reading -------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return self.built.end

    def batch(self, indices) -> np.ndarray:
        """Samples at global positions ``indices`` (>= the resumed position)."""
        return self.dataset.batch(np.asarray(indices, dtype=np.int64) - self.base)

    def check_ids(self, batch: np.ndarray, indices) -> None:
        """Refuse token ids outside the tokenizer's vocabulary (see BlendedGPTDataset.check_ids)."""
        self.dataset.check_ids(batch, np.asarray(indices, dtype=np.int64) - self.base)

    def _local(self, lo: int, hi: int) -> np.ndarray:
        return self.built.dataset_index[max(lo - self.base, 0) : max(hi - self.base, 0)]

    def _by_source(self, lo: int, hi: int) -> np.ndarray:
        return np.bincount(self._part_source[self._local(lo, hi)], minlength=len(self._index))

    # -- the ledger ----------------------------------------------------------------------------------
    def drawn_since_resume(self, position: int) -> np.ndarray:
        """Samples drawn from each source between the resumed position and ``position`` (incremental)."""
        at, counts = self._counted
        if position < at:
            at, counts = self.resumed_at, np.zeros_like(counts)
        counts = counts + self._by_source(at, position)
        self._counted = (position, counts)
        return counts

    def consumed_tokens(self, position: int) -> dict[str, int]:
        """Tokens each source gave the run up to ``position`` (for metrics.jsonl); over
        :data:`MAX_SOURCES_LOGGED` sources, summed per folder (``web/``), so a blend of thousands of shards
        does not write thousands of numbers per log step (the checkpoint's ledger keeps each source)."""
        since = self.drawn_since_resume(position)
        tokens = {
            key: (rec.drawn + int(since[self._index[key]])) * self.seq_length
            for key, rec in self.sources.items()
        }
        if len(tokens) <= MAX_SOURCES_LOGGED:
            return {self.sources[key].spec.name: n for key, n in tokens.items()}
        if self._folders is None:
            self._folders = folder_names({key: rec.spec.prefix for key, rec in self.sources.items()})
        out: dict[str, int] = {}
        for key, n in tokens.items():
            out[self._folders[key]] = out.get(self._folders[key], 0) + n
        return out

    def _stage_draws(self, position: int) -> list[tuple[int, dict[str, int]]]:
        """Per live stage begun before ``position``: the draws of each of its sources up to ``position``."""
        out = []
        for k, stage in enumerate(self.built.stages):
            if stage.start >= position:
                break
            counts = self._by_source(max(stage.start, self.base), min(stage.end, position))
            before = self.built.before[k]
            out.append((k, {key: before.get(key, 0) + int(counts[self._index[key]]) for key in stage.keys}))
        return out

    def positions(self, position: int) -> dict[str, int]:
        """Each source's cursor at ``position``."""
        out = {key: rec.position for key, rec in self.sources.items()}
        for k, draws in self._stage_draws(position):
            for key, drawn in draws.items():
                out[key] = self.built.position_after(k, key, drawn)
        return out

    def _passed_over(self, position: int) -> dict[str, list[int]]:
        """Per source: the stream positions passed over (quarantine) since the resume, up to ``position``."""
        out: dict[str, list[int]] = {}
        for k, draws in self._stage_draws(position):
            stage = self.built.stages[k]
            for key, drawn in draws.items():
                taken = self.built.draws[k].get(key)
                if taken is None or drawn == 0:
                    continue
                taken = taken[:drawn]
                gaps = np.setdiff1d(np.arange(stage.offsets[key], int(taken[-1]) + 1), taken)
                since = self.sources[key].position
                out.setdefault(key, []).extend(g for g in gaps.tolist() if g >= since)
        return out

    def stage_at(self, position: int) -> Stage | None:
        for stage in reversed(self.built.stages):
            if stage.start <= position < stage.end:
                return stage
        return None

    def state(self, position: int, step: int | None = None) -> dict:
        """The ledger at ``position`` (kept in the checkpoint saved there)."""
        since = self.drawn_since_resume(position)
        now = self.positions(position)
        passed = self._passed_over(position)
        sources = []
        for key, rec in self.sources.items():
            moved = now[key] - rec.position
            drawn = int(since[self._index[key]])
            repeated = max(0, min(now[key], rec.high_water) - min(rec.position, rec.high_water))
            current = replace(
                rec,
                drawn=rec.drawn + drawn,
                position=now[key],
                skipped=rec.skipped + max(moved - drawn, 0),
                repeated=rec.repeated + repeated,
                passed_over=(rec.passed_over + passed.get(key, []))[:MAX_PASSED_OVER],
            )
            sources.append(current.to_json(self.seq_length))
        stages = [s.to_json() for s in self.history]
        for stage in self.built.stages:
            if stage.start < position:
                stages.append(stage.to_json())
        current = self.stage_at(position) or self.stage_at(position - 1)
        return {
            "format": FORMAT,
            "version": VERSION,
            "run": self.run,
            "position": position,
            "step": step,
            "seq_length": self.seq_length,
            "tokenizer_hash": (self.tokenizer or {}).get("hash"),
            "plan": {"identity": self.plan.identity, "path": self.plan.origin, "base": self.plan_base},
            "stage": None if current is None else current.origin,
            "sources": sources,
            "stages": stages,
            "resets": self.resets,
        }

    def describe(self, positions) -> list[dict]:
        """What the samples at global ``positions`` are: source, stream position, GPT sample, documents."""
        out = []
        for position in np.asarray(positions, dtype=np.int64).tolist():
            local = position - self.base
            key, segment = self.built.parts[int(self.built.dataset_index[local])]
            within = int(self.built.dataset_sample_index[local])
            stream = self.streams[key]
            stream_position = stream.start(segment) + within
            out.append(
                {
                    "position": position,
                    "source": stream.spec.name,
                    "key": key,
                    "prefix": stream.spec.prefix,
                    "stream_position": stream_position,
                    "segment": segment,
                    "sample": int(stream.segment(segment).shuffle_index[within]),
                    "documents": stream.documents(stream_position),
                }
            )
        return out
