"""``RUN/quarantine.jsonl``: the samples of batches that tripped the training health gate.

One JSON object per line (schema: ``schemas/quarantine.schema.json``), appended by ``llm-train`` when the
health gate trips (a NaN/inf loss or grad norm, a grad-norm spike): the run's id, the step, the rank that
drew the samples, why, and the exact samples — source (its key: the sha256 of its ``.idx``, and where it
was read), the sample's stream position and GPT sample id, and the documents it reads with token offsets.

A resumed run (``--resume auto``) reads the file back and passes over every later sample that reads a
quarantined document. The file is untrusted on the way in: every line is checked, and a line written by
another run is refused. No torch here.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from llmtools.errors import InputError
from llmtools.formats import jsonfile
from llmtools.fsutil import sha256_file

FORMAT = "llmtools.quarantine"
VERSION = 1
NAME = "quarantine.jsonl"
MAX_LINE = 16 << 20  # a line holds one rank's samples of one batch: far below this
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def quarantine_path(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / NAME


def make_record(run: str, step: int, rank: int, reason: str, samples: list[dict], note: str = "") -> dict:
    return {
        "format": FORMAT,
        "version": VERSION,
        "run": run,
        "step": int(step),
        "rank": int(rank),
        "reason": reason,
        "note": note,
        "samples": samples,
    }


def append_records(path: str | os.PathLike, records: list[dict]) -> None:
    """Append whole lines in one write, flushed to disk (a crash leaves at most a torn last line)."""
    if not records:
        return
    text = "".join(jsonfile.dumps(r, separators=(",", ":")) + "\n" for r in records)
    from llmtools.dirfd import open_path

    fd = open_path(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)  # never through a planted link
    try:
        os.write(fd, text.encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)


def _int(value, low: int = 0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def _check_sample(sample, at: str) -> None:
    if not isinstance(sample, dict):
        raise InputError(f"{at}: expected an object")
    if not isinstance(sample.get("key"), str) or not _SHA256.match(sample["key"]):
        raise InputError(f"{at}.key: expected the sha256 of the source's .idx (64 hex digits)")
    for key in ("source", "prefix"):
        if not isinstance(sample.get(key), str):
            raise InputError(f"{at}.{key}: missing or not a string")
    for key in ("position", "stream_position", "segment", "sample"):
        if not _int(sample.get(key)):
            raise InputError(f"{at}.{key}: missing or not an integer >= 0")
    documents = sample.get("documents")
    if not isinstance(documents, list) or not documents:
        raise InputError(f"{at}.documents: expected a non-empty list")
    for j, doc in enumerate(documents):
        ok = isinstance(doc, dict) and all(_int(doc.get(k)) for k in ("document", "sequence", "start", "end"))
        if not ok or doc["end"] < doc["start"]:
            raise InputError(
                f"{at}.documents[{j}]: expected {{document, sequence, start, end}} integers, start <= end"
            )


def read_records(
    path: str | os.PathLike, run: str | None, whose: str = "this run", with_lines: bool = False
) -> list:
    """Every record of ``path``, checked; a record of another run than ``run`` is refused (InputError
    naming the line and both runs). A torn last line (a crash while appending) is ignored. With
    ``with_lines``: ``(line number, record)`` pairs."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    except OSError as error:
        raise InputError(f"{path}: cannot read ({error.strerror})") from None
    lines = data.split(b"\n")
    torn = lines.pop() if lines else b""  # empty when the file ends with a newline
    records = []
    for number, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        records.append((number, _parse(raw, f"{path}:{number}", run, whose)))
    if torn.strip():
        try:
            records.append((len(lines) + 1, _parse(torn, f"{path}:{len(lines) + 1}", run, whose)))
        except InputError:
            pass  # a line cut short by a crash while it was written: nothing was quarantined by it
    if run is None and len({r["run"] for _, r in records}) > 1:
        first = records[0][1]["run"]
        number, other = next((n, r) for n, r in records if r["run"] != first)
        raise InputError(
            f"{path}:{number}: written by run {other['run']}, line {records[0][0]} by run {first}: "
            "one quarantine file holds one run's records"
        )
    return records if with_lines else [r for _, r in records]


def sample_tokens(path: str | os.PathLike, numbered: list) -> list[tuple[dict, dict, list]]:
    """``(record, sample, [(document entry, token ids), ...])`` for every quarantined sample of
    ``numbered`` (from :func:`read_records` with lines); InputError when a source is missing or no longer
    the data the run read (its ``.idx`` changed: the offsets would point at other text)."""
    from llmtools.formats.indexed import IndexedDatasetReader

    readers: dict[str, IndexedDatasetReader] = {}
    out = []
    for number, record in numbered:
        for sample in record["samples"]:
            key, prefix = sample["key"], sample["prefix"]
            reader = readers.get(key)
            if reader is None:
                idx = Path(f"{prefix}.idx")
                if not idx.is_file() or not Path(f"{prefix}.bin").is_file():
                    raise InputError(f"{path}:{number}: source {prefix}: no such dataset (.bin/.idx missing)")
                have = sha256_file(idx)
                if have != key:
                    raise InputError(
                        f"{path}:{number}: source {prefix} changed since it was quarantined (.idx sha256 "
                        f"{have[:12]}…, the record names {key[:12]}…)"
                    )
                reader = readers[key] = IndexedDatasetReader(prefix)
            pieces = []
            for doc in sample["documents"]:
                sequence = doc["sequence"]
                if sequence >= reader.num_sequences or doc["end"] > int(reader.sequence_lengths[sequence]):
                    raise InputError(
                        f"{path}:{number}: sequence {sequence} tokens {doc['start']}..{doc['end']} "
                        f"are not in {prefix}"
                    )
                pieces.append(
                    (doc, reader.get(sequence, offset=doc["start"], length=doc["end"] - doc["start"]))
                )
            out.append((record, sample, pieces))
    return out


def _parse(raw: bytes, at: str, run: str | None, whose: str) -> dict:
    if len(raw) > MAX_LINE:
        raise InputError(f"{at}: a line of {len(raw)} bytes (more than {MAX_LINE}); not a quarantine file")
    record = jsonfile.parse_line(raw, at, ours=True)
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise InputError(f"{at}: not a quarantine record (format is not {FORMAT!r})")
    if record.get("version") != VERSION:
        raise InputError(f"{at}: unsupported version {record.get('version')!r} (this is {VERSION})")
    if not isinstance(record.get("run"), str) or not record["run"]:
        raise InputError(f"{at}.run: missing")
    if run is not None and record["run"] != run:
        raise InputError(
            f"{at}: written by run {record['run']}, but {whose} is run {run}: a quarantine file of another "
            "run (move it away, or resume the run it belongs to)"
        )
    for key in ("step", "rank"):
        if not _int(record.get(key)):
            raise InputError(f"{at}.{key}: missing or not an integer >= 0")
    if not isinstance(record.get("samples"), list):
        raise InputError(f"{at}.samples: expected a list")
    for i, sample in enumerate(record["samples"]):
        _check_sample(sample, f"{at}.samples[{i}]")
    return record
