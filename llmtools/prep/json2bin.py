"""json2bin: documents -> Megatron-LM ``.bin/.idx`` (+ sidecar), byte-identical to ``preprocess_data.py``.

Pipeline (each step separable, datatrove-style):

    DocumentSource.batches()  ->  work items (JSONL: raw chunks of whole lines, with file and line)
    encode_item() in N worker processes: parse (JSON, checks) + batched encode -> flat token arrays
    IndexedDatasetWriter.add_documents() in the main process: one bulk write per batch and key

With gigatoken (the fast backend) there are no worker processes: its batch encode runs on its own
thread pool of ``workers`` threads (``RAYON_NUM_THREADS``, set here; a pool does not survive fork)
with the GIL released, so the main thread reads and parses the next ~8 MB while two encoder threads
encode the previous ones (``_threaded_stream``). JSON parsing is then done in C
(``_native/jsonl.c``): the texts reach gigatoken as one UTF-8 buffer with offsets, with no Python
object per document; a chunk with any unusual line (a bad one, a blank one, NaN, ...) is parsed by the
Python path instead, with the same outcome. gigatoken's one-time set-up (importing awkward, ~0.3 s)
runs in a thread beside the first parsing, as part of its identity probe (``defer_probe``).

Memory is bounded: at most ``2 * workers + 2`` work items (about 1 MiB of input each), or four
groups of ~8 MB with gigatoken, are in flight, and the writer keeps its per-document bookkeeping on
disk. Order is preserved, so the output does not depend on the number of workers.

Megatron compatibility (``tools/preprocess_data.py``): one output pair per json key, named
``{prefix}_{key}_document``; each text is encoded with the tokenizer's normal call (special-token
policy ``auto``, see :mod:`llmtools.tokenize.base`); ``append_eod`` appends EOD to non-empty
documents only; an empty document (no tokens) still gets a document index but no sequence; uint16
tokens when the vocabulary is below 65500, else int32.

At scale: ``shard=ShardSpec(i, n)`` tokenizes only shard i of the inputs (:mod:`llmtools.prep.shards`;
``llm-prep merge`` joins the shards back, :mod:`llmtools.prep.merge`), and ``partitions=n`` writes
Megatron's ``--partitions`` document order (:mod:`llmtools.prep.partitions`). With ``megatron=`` (Megatron's
``--tokenizer-type`` flags, :mod:`llmtools.tokenize.megatron`) the tokenizer is the one Megatron builds.

Plain API::

    from llmtools.prep.json2bin import json2bin
    result = json2bin(["corpus.jsonl"], "tokenizers/gpt2", "out/corpus", append_eod=True, workers=2)
    result.prefixes   # ["out/corpus_text_document"]
"""

from __future__ import annotations

import os
import sys
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from llmtools import interrupt
from llmtools.errors import InputError, LlmtoolsError, RuntimeFailure, UsageError
from llmtools.formats.curation_stats import provenance, read_stats
from llmtools.formats.indexed import dtype_for_vocab
from llmtools.formats.output_marks import check_output_prefix
from llmtools.formats.sidecar import build_sidecar
from llmtools.prep.dataset_output import DatasetOutput
from llmtools.prep.encode_guard import batch_places, encode_located
from llmtools.prep.jsonl import JsonlSource, expand_inputs
from llmtools.prep.partitions import PartitionedWriter
from llmtools.prep.shards import ShardAssignment, ShardSpec, plan_shards
from llmtools.prep.sources import DocumentSource, join_texts
from llmtools.progress import Progress
from llmtools.tokenize import load_tokenizer
from llmtools.tokenize.megatron import MegatronTokenizerArgs, load_megatron_tokenizer

MAX_WORKERS = 1024  # processes or threads: more is a typo (and a fork bomb), not a machine


@dataclass
class Json2BinConfig:
    inputs: Sequence[str] = ()
    """JSONL files, globs, '-' for stdin, .gz/.zst (ignored when a source is given)."""
    tokenizer: str = "byte"
    """tokenizer.json, HF folder, vocab.json (+merges.txt), .model, or 'byte' (--tokenizer)."""
    output_prefix: str = ""
    """Output prefix; files are {prefix}_{key}_document.{bin,idx,json} (--output/-o)."""
    json_keys: Sequence[str] = ("text",)
    """JSON keys to tokenize, one output pair each (--json-keys)."""
    append_eod: bool = False
    """Append the tokenizer's EOD id to every non-empty document (--append-eod)."""
    workers: int | None = None
    """Encoding processes, or gigatoken's threads (--workers); default: all CPU cores available to this process."""
    backend: str = "auto"
    """auto | tokenizers | gigatoken (--backend)."""
    special_tokens: str = "auto"
    """auto | split | plain: what a special token's string in the text becomes (--special-tokens)."""
    skip_bad: bool = False
    """Skip bad lines/files and count them by kind instead of stopping (--skip-bad)."""
    force: bool = False
    """Overwrite existing outputs (--force)."""
    chunk_bytes: int = 1 << 20
    """Input bytes per work item sent to a worker."""
    progress: bool | None = None
    """Progress bar on stderr; None = when stderr is a terminal."""
    durable: bool = True
    shard: ShardSpec | None = None
    """Process only shard I of N of the inputs (--shard I/N); see :mod:`llmtools.prep.shards`."""
    megatron: MegatronTokenizerArgs | None = None
    """Megatron's tokenizer flags (--tokenizer-type ...), used instead of ``tokenizer`` when given."""
    partitions: int = 1
    """Megatron's --partitions: its document order (round-robin over N partitions, then concatenated)."""
    keep_sequential_samples: bool = False
    """Megatron's --keep-sequential-samples: partitions are contiguous blocks, so the input order stays."""
    log_interval: int | None = None
    """Megatron's --log-interval: a 'Processed N documents' line on stderr every N documents."""
    provenance: Sequence[str] = ()
    """Stats files of the curation that made the inputs (--provenance), carried into the sidecar."""

    def __post_init__(self) -> None:
        self.json_keys = tuple(self.json_keys)
        if self.partitions < 1:
            raise UsageError(f"--partitions: must be at least 1, got {self.partitions}")
        if self.log_interval is not None and self.log_interval < 1:
            raise UsageError(f"--log-interval: must be at least 1, got {self.log_interval}")
        if self.partitions > 1 and self.shard is not None and not self.keep_sequential_samples:
            raise UsageError(
                "--partitions with --shard: Megatron's partition order runs over all the inputs, which one "
                "shard does not see; shard without --partitions (merged shards keep the input order)"
            )
        if self.megatron is not None and self.special_tokens != "auto":
            raise UsageError(
                "--special-tokens with --tokenizer-type: Megatron's flags decide what special-token strings "
                "become (--legacy-tokenizer for the legacy system's behaviour)"
            )

        check_output_prefix(self.output_prefix, "--output")
        if not self.json_keys or any(not k for k in self.json_keys):
            raise UsageError("--json-keys: give at least one non-empty key")
        if len(set(self.json_keys)) != len(self.json_keys):
            raise UsageError(f"--json-keys: duplicate key in {list(self.json_keys)}")
        if self.workers is None:
            self.workers = default_workers()
        if not 1 <= self.workers <= MAX_WORKERS:
            raise UsageError(f"--workers: must be from 1 to {MAX_WORKERS}, got {self.workers}")
        if self.chunk_bytes < 1:
            raise UsageError(f"--chunk-bytes: must be positive, got {self.chunk_bytes}")

    def prefix_for(self, key: str) -> str:
        """``{prefix}_{key}_document``, with ``-0000I-of-0000N`` after the prefix for a shard."""
        shard = self.shard.suffix if self.shard is not None else ""
        return f"{self.output_prefix}{shard}_{key}_document"

    def output(self) -> DatasetOutput:
        """What this run writes: ``.bin``, ``.idx`` and sidecar per key (with --force, a killed run's
        temporaries of them go too)."""
        prefixes = [self.prefix_for(key) for key in self.json_keys]
        return DatasetOutput(prefixes, force=self.force, clear_stale=True, durable=self.durable)


def default_workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


@dataclass
class Json2BinResult:
    prefixes: list[str]
    paths: list[str]
    documents: int = 0
    empty_documents: dict[str, int] = field(default_factory=dict)
    tokens: dict[str, int] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)
    input_bytes: int = 0
    seconds: float = 0.0
    backend: str = ""
    workers: int = 1
    dtype: str = ""
    shard: dict | None = None

    def summary(self) -> str:
        secs = max(self.seconds, 1e-9)
        tokens = sum(self.tokens.values())
        empty = sum(self.empty_documents.values())
        skipped = sum(v for k, v in self.skipped.items() if k != "blank_line")
        parts = [f"{self.documents:,} documents", f"{tokens:,} tokens"]
        parts.append(
            f"{empty:,} empty (kept as Megatron does: a document index, no tokens)" if empty else "0 empty"
        )
        parts.append(
            f"{skipped:,} skipped"
            + (
                f" ({', '.join(f'{k}: {v}' for k, v in sorted(self.skipped.items()))})"
                if self.skipped
                else ""
            )
        )
        rate = f"{self.input_bytes / 1e6 / secs:.1f} MB/s, {self.documents / secs:,.0f} docs/s, {tokens / secs:,.0f} tokens/s"
        if self.shard is not None:
            s = self.shard
            parts.insert(
                0,
                f"shard {s['index']}/{s['count']}: {s['inputs']:,} of {s['inputs_total']:,} inputs "
                f"({s['bytes'] / 1e6:,.1f} of {s['bytes_total'] / 1e6:,.1f} MB)",
            )
        return f"{', '.join(parts)}; {self.input_bytes / 1e6:.1f} MB in {self.seconds:.2f} s ({rate}; {self.backend}, {self.workers} workers)"

    def to_dict(self) -> dict:
        return {
            "prefixes": self.prefixes,
            "paths": self.paths,
            "documents": self.documents,
            "empty_documents": self.empty_documents,
            "tokens": self.tokens,
            "skipped": self.skipped,
            "input_bytes": self.input_bytes,
            "seconds": round(self.seconds, 4),
            "backend": self.backend,
            "workers": self.workers,
            "dtype": self.dtype,
            "shard": self.shard,
        }


# -- the encode step (runs in worker processes) --------------------------------------------------------
@dataclass
class EncodedBatch:
    tokens: dict[str, np.ndarray]
    lengths: dict[str, np.ndarray]
    documents: int
    bad: list
    blank_lines: int
    nbytes: int


def append_eod_ids(flat: np.ndarray, lengths: np.ndarray, eod: int) -> tuple[np.ndarray, np.ndarray]:
    """Append ``eod`` to every non-empty document (Megatron: empty documents stay empty)."""
    nonempty = lengths > 0
    if not nonempty.any():
        return flat, lengths
    ends = np.cumsum(lengths)[nonempty]
    return np.insert(flat, ends, eod), lengths + nonempty


def encode_item(
    item, tokenizer, keys: Sequence[str], append_eod: bool, dtype, skip_bad: bool
) -> EncodedBatch:
    """Parse one work item and encode its texts for every key."""
    batch = item.parse(keys, skip_bad)
    tokens, lengths = {}, {}
    if batch.bad and not skip_bad:
        # Encode nothing: the run is about to stop at the first bad line.
        return EncodedBatch({}, {}, 0, batch.bad[:1], batch.blank_lines, batch.nbytes)
    info = np.iinfo(dtype)
    for key in keys:
        flat, lens = encode_located(tokenizer, batch.texts[key], batch_places([batch]))
        tokens[key], lengths[key] = _finish(flat, lens, tokenizer, append_eod, dtype, info)
    return EncodedBatch(tokens, lengths, len(batch), batch.bad, batch.blank_lines, batch.nbytes)


def _finish(flat, lens, tokenizer, append_eod, dtype, info):
    if flat.size and flat.dtype != dtype and (int(flat.max()) > info.max or int(flat.min()) < info.min):
        raise RuntimeFailure(
            f"token id {int(flat.max())} does not fit {np.dtype(dtype).name} "
            f"(the tokenizer's vocab_size {tokenizer.vocab_size} is wrong?)"
        )
    flat = flat.astype(dtype, copy=False)
    if append_eod:
        flat, lens = append_eod_ids(flat, lens, tokenizer.eod_id)
    return flat, lens


_WORKER: dict = {}


def _init_worker(tokenizer, keys, append_eod, dtype, skip_bad, parent: int) -> None:
    # SIGTERM/SIGINT reach the whole process group (Ctrl-C, Slurm): the parent alone decides; it kills
    # its workers when it stops.
    interrupt.reset_in_child()
    _WORKER.update(tokenizer=tokenizer, keys=keys, append_eod=append_eod, dtype=dtype, skip_bad=skip_bad)
    _exit_with_parent(parent)


def _exit_with_parent(parent: int) -> None:
    """If the main process is killed (SIGKILL), its workers would wait on their queue forever: exit instead."""
    import threading

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="llmtools-parent-watch", daemon=True).start()


def _work(item) -> EncodedBatch:
    w = _WORKER
    return encode_item(item, w["tokenizer"], w["keys"], w["append_eod"], w["dtype"], w["skip_bad"])


def _encoded_stream(source: DocumentSource, tokenizer, config: Json2BinConfig, dtype):
    """EncodedBatches in input order, from ``config.workers`` processes with bounded look-ahead."""
    args = (tokenizer, config.json_keys, config.append_eod, dtype, config.skip_bad)
    if config.workers > 1 and getattr(tokenizer, "parallel_in_process", False):
        yield from _threaded_stream(source, tokenizer, config, dtype)
        return
    if config.workers == 1:
        for item in source.batches():
            yield encode_item(item, *args)
        return
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    # fork: workers inherit the loaded tokenizer for free. ProcessPoolExecutor (not multiprocessing.Pool)
    # because it notices a worker that dies (OOM killer) instead of waiting for its result forever.
    method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
    executor = ProcessPoolExecutor(
        config.workers,
        mp_context=mp.get_context(method),
        initializer=_init_worker,
        initargs=(*args, os.getpid()),
    )
    finished = False
    try:
        pending: deque = deque()
        limit = 2 * config.workers + 2
        for item in source.batches():
            pending.append(executor.submit(_work, item))
            if len(pending) >= limit:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
        finished = True
    except BrokenProcessPool:
        raise RuntimeFailure(
            "json2bin: a worker process died (killed, or out of memory?); no output was written"
        ) from None
    finally:
        if not finished:  # stop at once: queued chunks are not needed any more (workers ignore SIGTERM)
            for process in list(getattr(executor, "_processes", {}).values()):
                process.kill()
        executor.shutdown(wait=True, cancel_futures=True)


GROUP_BYTES = 8 << 20
"""Input bytes per encode call in the threaded pipeline: gigatoken's per-call cost is large (raw
gigatoken over 600 MB: 4 / 16 / 64 MB calls take 3.97 / 3.16 / 2.81 s); 8 MB was json2bin's best here."""
ENCODERS = 2
"""Encode calls in flight at once: while one call's last documents keep a core busy, the next call's
fill the others (measured: 5-10% faster end to end than one call at a time on 2 cores)."""


def _encode_group(batches: list, tokenizer, keys: Sequence[str], append_eod: bool, dtype) -> EncodedBatch:
    """Encode parsed DocBatches as one batch per key (runs in the encoder thread; the GIL is released
    while gigatoken's thread pool encodes)."""
    info = np.iinfo(dtype)
    tokens, lengths = {}, {}
    for key in keys:
        texts = join_texts([b.texts[key] for b in batches])
        flat, lens = encode_located(tokenizer, texts, batch_places(batches), hold_stderr=False)
        tokens[key], lengths[key] = _finish(flat, lens, tokenizer, append_eod, dtype, info)
    return EncodedBatch(
        tokens,
        lengths,
        sum(len(b) for b in batches),
        [r for b in batches for r in b.bad],
        sum(b.blank_lines for b in batches),
        sum(b.nbytes for b in batches),
    )


def _threaded_stream(source: DocumentSource, tokenizer, config: Json2BinConfig, dtype):
    """The pipeline for a tokenizer whose batch encode runs on its own thread pool with the GIL released
    (gigatoken): this thread reads and parses (JSON, in C: texts come as FlatTexts) while ENCODERS
    threads encode the previous groups of about GROUP_BYTES with all ``workers`` cores. No processes: no
    pickling, nothing imported twice, and big batches for the pool. At most ENCODERS + 1 groups wait
    for the encoders, so memory stays bounded. Results are yielded in input order."""
    from concurrent.futures import ThreadPoolExecutor

    keys, skip_bad = config.json_keys, config.skip_bad
    pending: deque = deque()
    group: list = []
    group_bytes = 0
    with ThreadPoolExecutor(ENCODERS, thread_name_prefix="llmtools-encode") as encoder:
        try:
            for item in source.batches():
                batch = item.parse(keys, skip_bad, flat=True)
                if batch.bad and not skip_bad:
                    # The run stops at its first bad line: what is queued is not needed any more.
                    yield EncodedBatch({}, {}, 0, batch.bad[:1], batch.blank_lines, batch.nbytes)
                    return
                group.append(batch)
                group_bytes += batch.nbytes
                if group_bytes >= GROUP_BYTES:
                    pending.append(
                        encoder.submit(_encode_group, group, tokenizer, keys, config.append_eod, dtype)
                    )
                    group, group_bytes = [], 0
                    while len(pending) >= ENCODERS + 1 or (pending and pending[0].done()):
                        yield pending.popleft().result()
            if group:
                pending.append(
                    encoder.submit(_encode_group, group, tokenizer, keys, config.append_eod, dtype)
                )
            while pending:
                yield pending.popleft().result()
        finally:
            for future in pending:
                future.cancel()


# -- the whole run ------------------------------------------------------------------------------------
def json2bin(
    inputs: Sequence[str] | None = None,
    tokenizer: str = "byte",
    output_prefix: str = "",
    *,
    source: DocumentSource | None = None,
    config: Json2BinConfig | None = None,
    **options,
) -> Json2BinResult:
    """Tokenize documents into ``{output_prefix}_{key}_document.{bin,idx,json}``.

    Either give ``inputs`` (JSONL paths/globs/'-') or a ready ``source`` (any DocumentSource).
    ``options`` are the other :class:`Json2BinConfig` fields. Raises InputError (bad input),
    UsageError (bad options, existing outputs without force, another writer at work on them),
    RuntimeFailure.
    """
    if config is None:
        config = Json2BinConfig(
            inputs=tuple(inputs or ()), tokenizer=str(tokenizer), output_prefix=str(output_prefix), **options
        )
    with config.output() as output:
        return _json2bin(config, source, output)


def _json2bin(config: Json2BinConfig, source: DocumentSource | None, output: DatasetOutput) -> Json2BinResult:
    assignment: ShardAssignment | None = None
    for path in config.provenance:  # a bad one is refused before any work; a missing one may be written
        if os.path.lexists(path):  # by the command piping into this one, by the time its output ends
            read_stats(path)
    if source is None:
        if not config.inputs:
            raise UsageError("json2bin: give at least one INPUT (a JSONL file, a glob, or - for stdin)")
        inputs = config.inputs
        if config.shard is not None:
            assignment = plan_shards(expand_inputs(inputs), config.shard)
            inputs = assignment.mine  # may be none: the shard is then an empty dataset
        source = JsonlSource(inputs, skip_bad=config.skip_bad, chunk_bytes=config.chunk_bytes)
    elif config.shard is not None:
        raise UsageError("--shard applies to JSONL inputs; this source cannot be sharded")
    # gigatoken encodes in this process on its thread pool, sized (once, at first use) from this variable.
    os.environ["RAYON_NUM_THREADS"] = str(config.workers)
    if config.megatron is not None:
        tok = load_megatron_tokenizer(config.megatron, backend=config.backend, defer_probe=True)
    else:
        tok = load_tokenizer(
            config.tokenizer, backend=config.backend, special_tokens=config.special_tokens, defer_probe=True
        )
    if config.workers > 1 and not tok.parallel_in_process:
        # Workers are forked after the tokenizer is loaded; Rust thread pools must not be used before.
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if config.append_eod and tok.eod_id is None:
        raise UsageError(f"--append-eod: tokenizer {tok.source} has no end-of-document token")
    dtype = dtype_for_vocab(tok.vocab_size)

    started = time.perf_counter()
    result = Json2BinResult(
        prefixes=[config.prefix_for(k) for k in config.json_keys],
        paths=[],
        workers=config.workers,
        dtype=dtype.name,
        shard=assignment.record() if assignment is not None else None,
    )
    skipped: dict[str, int] = {}
    progress = _Progress(config.progress, source.total_bytes, config.log_interval)
    try:
        # The writers commit .bin/.idx only if the loop completes.
        if config.partitions > 1 and not config.keep_sequential_samples:
            writers = [
                output.enter(
                    PartitionedWriter(config.prefix_for(k), dtype, config.partitions, durable=config.durable)
                )
                for k in config.json_keys
            ]
        else:  # one partition, or contiguous ones (--keep-sequential-samples): the input order
            writers = [output.open(config.prefix_for(k), dtype) for k in config.json_keys]
        for encoded in _encoded_stream(source, tok, config, dtype):
            if encoded.bad:
                if not config.skip_bad:
                    raise InputError(encoded.bad[0].message)
                for record in encoded.bad:
                    skipped[record.kind] = skipped.get(record.kind, 0) + 1
            if encoded.blank_lines:
                skipped["blank_line"] = skipped.get("blank_line", 0) + encoded.blank_lines
            if encoded.documents:
                for key, writer in zip(config.json_keys, writers, strict=True):
                    lengths = encoded.lengths[key]
                    writer.add_documents(encoded.tokens[key], lengths)
                    result.empty_documents[key] = result.empty_documents.get(key, 0) + int(
                        (lengths == 0).sum()
                    )
            result.documents += encoded.documents
            result.input_bytes += encoded.nbytes
            progress.update(
                encoded.nbytes, encoded.documents, sum(int(t.size) for t in encoded.tokens.values())
            )
        progress.close()
        for key, value in source.skipped.items():
            skipped[key] = skipped.get(key, 0) + value
        result.skipped = skipped
        result.backend = tok.backend  # known once gigatoken's probe has settled (see load_tokenizer)
        inputs = source.inputs()
        stages = [(str(path), read_stats(path)) for path in config.provenance]
        curation = provenance(stages, inputs) if stages else None
        for key, writer in zip(config.json_keys, writers, strict=True):
            result.tokens[key] = writer.num_tokens
            result.empty_documents.setdefault(key, 0)
            output.set_sidecar(
                config.prefix_for(key),
                json2bin_sidecar(
                    tok, key, config, dtype, inputs, writer, result.empty_documents[key], result, curation
                ),
            )
        result.paths = [str(path) for path in output.commit()]
    except (LlmtoolsError, OSError):
        raise
    except Exception as error:  # noqa: BLE001 - a worker or tokenizer failure: one line, exit 1
        raise RuntimeFailure(f"json2bin failed: {type(error).__name__}: {error}") from error
    finally:
        progress.close()
    result.seconds = time.perf_counter() - started
    return result


def json2bin_sidecar(
    tok, key, config, dtype, inputs, writer, empty, result: Json2BinResult, curation: list | None = None
) -> dict:
    """The sidecar of one key's dataset, complete: the common record, then what this run adds (the
    shard, Megatron's tokenizer flags, the partition order, the curation of its inputs)."""
    blocks: dict = {}
    if result.shard is not None:
        blocks["shard"] = result.shard
    if config.megatron is not None:
        blocks["megatron"] = config.megatron.record()
    if config.partitions > 1:
        blocks["partitions"] = {
            "count": config.partitions,
            "order": "input order (contiguous blocks)"
            if config.keep_sequential_samples
            else "Megatron's: document g in partition g % N, partitions concatenated",
        }
    if curation is not None:
        blocks["curation"] = curation
    return build_sidecar(
        tokenizer=tok.identity(),
        dtype=dtype,
        inputs=inputs,
        documents=writer.num_documents,
        sequences=writer.num_sequences,
        tokens=writer.num_tokens,
        json_key=key,
        append_eod=config.append_eod,
        special_tokens=config.special_tokens if config.megatron is None else tok.policy,
        empty_documents=empty,
        skipped=result.skipped,
        **blocks,
    )


class _Progress:
    """The progress in input bytes, with docs/s and tokens/s (:class:`llmtools.progress.Progress`: a bar
    on a terminal, plain lines otherwise); silent when disabled."""

    def __init__(self, enabled: bool | None, total: int | None, log_interval: int | None = None) -> None:
        # Megatron's lines (--log-interval) replace ours, on a terminal or not; -q silences both.

        self.log_interval = log_interval if enabled is not False else None
        self.docs = self.tokens = self.nbytes = 0
        self.start = time.perf_counter()
        self.bar = Progress(
            total, "json2bin", unit="B", enabled=enabled is not False and log_interval is None
        )

    def update(self, nbytes: int, docs: int, tokens: int) -> None:
        before = self.docs
        self.docs += docs
        self.tokens += tokens
        self.nbytes += nbytes
        secs = max(time.perf_counter() - self.start, 1e-9)
        if self.log_interval and self.docs // self.log_interval > before // self.log_interval:
            # Megatron's progress line (its MB are MiB).
            print(
                f"Processed {self.docs} documents ({self.docs / secs} docs/s, {self.nbytes / secs / 1024 / 1024} MB/s).",
                file=sys.stderr,
                flush=True,
            )
        self.bar.set_postfix(f"{self.docs / secs:,.0f} docs/s, {self.tokens / secs:,.0f} tok/s")
        self.bar.update(nbytes)

    def close(self) -> None:
        self.bar.close()
