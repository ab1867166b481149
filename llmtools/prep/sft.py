"""SFT data: conversations -> token ids + loss mask (+ segment ids when packed), as aligned indexed datasets.

Pipeline (each step a small function, so each can be tested alone)::

    read records (JSONL / local HF dataset)  ->  to_messages (per --format, validated)
      ->  render with the chat template, assistant character spans  ->  tokenize the whole rendering
      ->  mask = 1 on tokens that overlap an assistant span  ->  --max-length truncate|drop  ->  [--pack]
      ->  PREFIX_input_ids_document, PREFIX_loss_mask_document [, PREFIX_segment_ids_document] + sidecars

Output (schema ``schemas/sft-sidecar.schema.json``): MMIDIDX datasets with one document per sample
(or per packed sequence), aligned token for token: ``loss_mask`` (uint8) is 1 where token ``t`` is
a target, i.e. ``labels = input_ids[1:]`` is trained where ``loss_mask[1:] == 1``. With ``--pack``
``segment_ids`` (uint16) numbers the samples inside each sequence 1, 2, 3, ...: attention must
stay within a segment and position ids restart at each new segment
(:func:`llmtools.formats.sft_layout.position_ids_from_segments`).

The whole rendering is tokenized in one call (as ``apply_chat_template(tokenize=True)`` does, so the
ids are the same) and the character offsets of ``tokenizers`` map assistant spans to tokens. For
tokenizers without offsets (SentencePiece ``.model``, ``byte``) the rendering is tokenized piece by
piece, cut at the span boundaries (identical for ``byte``; SentencePiece may differ at a boundary).

Bad records (kind = key in the sidecar's ``counts.skipped``): ``malformed_json``, ``invalid_utf8``,
``not_an_object``, ``missing_key``, ``not_a_string``, ``bad_messages`` (not a list of objects),
``unknown_role``, ``empty_assistant``, ``no_assistant``, ``template_error``. The first stops the run
with ``file:line: what is wrong`` (exit 2, no output); ``skip_bad`` skips and counts them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from llmtools.errors import InputError, UsageError
from llmtools.formats import jsonfile
from llmtools.formats.indexed import dtype_for_vocab
from llmtools.formats.output_marks import check_output_prefix
from llmtools.formats.sft_layout import KEYS, SFT_FORMAT
from llmtools.formats.sidecar import build_sidecar
from llmtools.prep.chat_template import (
    DEFAULT_TEMPLATE_DATE,
    MAX_RENDER_SECONDS,
    ChatTemplate,
    TemplateRenderError,
    load_chat_template,
    split_markers,
    split_note,
)
from llmtools.prep.dataset_output import DatasetOutput
from llmtools.prep.encode_guard import guarded
from llmtools.prep.hf_import import file_inputs
from llmtools.prep.hf_open import looks_like_hf, open_hf
from llmtools.prep.jsonl import JsonlSource
from llmtools.prep.template_sandbox import check_date
from llmtools.progress import Progress
from llmtools.tokenize import load_tokenizer

FORMATS = ("messages", "prompt-response", "alpaca")
OVERFLOW = ("truncate", "drop")
ROLES = ("system", "user", "assistant")
ENCODE_BATCH = 256  # renderings tokenized per call


@dataclass
class SftConfig:
    """What ``llm-prep sft`` does; each field names its flag in errors."""

    inputs: list[str]
    tokenizer: str
    output_prefix: str
    format: str = "messages"
    chat_template: str | None = None
    messages_key: str = "messages"
    prompt_key: str = "prompt"
    response_key: str = "response"
    system_key: str = "system"
    system_prompt: str | None = None
    max_length: int | None = None
    overflow: str = "truncate"
    pack: bool = False
    append_eod: bool = False
    split: str | None = None
    skip_bad: bool = False
    force: bool = False
    template_timeout: float = MAX_RENDER_SECONDS
    template_date: str = DEFAULT_TEMPLATE_DATE

    def __post_init__(self) -> None:
        try:
            check_date(self.template_date)
        except InputError as error:
            raise UsageError(str(error)) from None
        if not (0 < self.template_timeout <= 86400):
            raise UsageError(
                f"--template-timeout: must be between 0 and 86400 seconds, got {self.template_timeout}"
            )
        if not self.inputs:
            raise UsageError("INPUT: give at least one input file or dataset")
        if self.format not in FORMATS:
            raise UsageError(f"--format: unknown format {self.format!r} (choose one of {', '.join(FORMATS)})")
        if self.overflow not in OVERFLOW:
            raise UsageError(
                f"--overflow: unknown policy {self.overflow!r} (choose one of {', '.join(OVERFLOW)})"
            )
        if self.max_length is not None and self.max_length < 1:
            raise UsageError(f"--max-length: must be at least 1, got {self.max_length}")
        if self.pack and self.max_length is None:
            raise UsageError("--pack: needs --max-length (the length of a packed sequence)")

        check_output_prefix(self.output_prefix, "--output")

    def prefix_for(self, key: str) -> str:
        return f"{self.output_prefix}_{key}_document"

    def output(self) -> DatasetOutput:
        """What this run writes: ``.bin``, ``.idx`` and sidecar per dataset."""
        return DatasetOutput([self.prefix_for(k) for k in self.keys], force=self.force)

    @property
    def keys(self) -> tuple[str, ...]:
        return KEYS if self.pack else KEYS[:2]

    def hf_columns(self) -> tuple[list[str], list[str]]:
        """The columns an HF dataset input must have, and those read when present."""
        if self.format == "messages":
            return [self.messages_key], [self.system_key]
        if self.format == "prompt-response":
            return [self.prompt_key, self.response_key], [self.system_key]
        return ["instruction", "output"], ["input", self.system_key]


@dataclass
class SftResult:
    paths: list[str] = field(default_factory=list)
    samples: int = 0  # written (after drops)
    sequences: int = 0  # documents written (== samples unless packed)
    tokens: int = 0
    target_tokens: int = 0
    truncated: int = 0
    dropped_too_long: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    split_markers: list[str] = field(default_factory=list)  # template markers the tokenizer lacks
    blank_lines: int = 0

    def counts(self) -> dict:
        return {
            "samples": self.samples,
            "sequences": self.sequences,
            "tokens": self.tokens,
            "target_tokens": self.target_tokens,
            "truncated": self.truncated,
            "dropped_too_long": self.dropped_too_long,
            "skipped": dict(self.skipped),
        }

    def to_dict(self) -> dict:
        return {"paths": list(self.paths), **self.counts()}

    def summary(self) -> str:
        bad = sum(self.skipped.values())
        return (
            f"{self.samples} samples in {self.sequences} sequences, {self.tokens} tokens "
            f"({self.target_tokens} trained), {self.truncated} truncated, {self.dropped_too_long} dropped "
            f"as too long, {bad} bad skipped" + split_note(self.split_markers)
        )


class BadSample(InputError):
    """One record that cannot become a sample; ``kind`` is its counter name."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


# ---------------------------------------------------------------------------------------------------
# Records -> messages
# ---------------------------------------------------------------------------------------------------
def to_messages(obj, config: SftConfig) -> list[dict]:
    """One input record as a validated conversation (raises :class:`BadSample`, without the place)."""
    if not isinstance(obj, dict):
        raise BadSample("not_an_object", f"expected a JSON object, got {type(obj).__name__}")
    if config.format == "messages":
        messages = _field(obj, config.messages_key, list, "bad_messages", "a list of messages")
        out = []
        system = obj.get(config.system_key)
        if isinstance(system, str) and not any(
            isinstance(m, dict) and m.get("role") == "system" for m in messages
        ):
            out.append({"role": "system", "content": system})
        out += check_messages(messages, config.messages_key)
    elif config.format == "prompt-response":
        prompt = _field(obj, config.prompt_key, str, "not_a_string", "a string")
        response = _field(obj, config.response_key, str, "not_a_string", "a string")
        out = system_turn(obj, config) + [
            {"role": "user", "content": prompt},
            {"role": "assistant", "content": response},
        ]
    else:  # alpaca
        instruction = _field(obj, "instruction", str, "not_a_string", "a string")
        output = _field(obj, "output", str, "not_a_string", "a string")
        extra = obj.get("input")
        if extra is not None and not isinstance(extra, str):
            raise BadSample("not_a_string", f"[input]: expected a string, got {kind_name(extra)}")
        user = f"{instruction}\n\n{extra}" if extra else instruction
        out = system_turn(obj, config) + [
            {"role": "user", "content": user},
            {"role": "assistant", "content": output},
        ]
    if config.system_prompt is not None and not any(m["role"] == "system" for m in out):
        out.insert(0, {"role": "system", "content": config.system_prompt})
    assistant = [i for i, m in enumerate(out) if m["role"] == "assistant"]
    if not assistant:
        raise BadSample("no_assistant", "no assistant turn (nothing to train on)")
    for i in assistant:
        if not out[i]["content"].strip():
            raise BadSample("empty_assistant", f"assistant turn {i} is empty")
    return out


def check_messages(messages: list, key: str) -> list[dict]:
    """A list of ``{role, content}`` messages, checked (roles: :data:`ROLES`) and copied without extra keys;
    ``key`` names the list in errors (raises :class:`BadSample`, without the place)."""
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise BadSample("bad_messages", f"{key}[{i}]: expected an object with role and content")
        for name in ("role", "content"):
            if name not in message:
                raise BadSample("missing_key", f"{key}[{i}]: missing key {name!r}")
            if not isinstance(message[name], str):
                raise BadSample(
                    "not_a_string", f"{key}[{i}][{name}]: expected a string, got {kind_name(message[name])}"
                )
        if message["role"] not in ROLES:
            raise BadSample(
                "unknown_role",
                f"{key}[{i}]: unknown role {message['role']!r} (expected one of {', '.join(ROLES)})",
            )
        out.append({"role": message["role"], "content": message["content"]})
    return out


def kind_name(value) -> str:
    return "null" if value is None else type(value).__name__


def _field(obj: dict, key: str, kind: type, bad_kind: str, what: str):
    if key not in obj:
        raise BadSample("missing_key", f"missing key {key!r} (have {', '.join(map(repr, obj)) or 'none'})")
    value = obj[key]
    if not isinstance(value, kind):
        raise BadSample(bad_kind, f"[{key}]: expected {what}, got {kind_name(value)}")
    return value


def system_turn(obj: dict, config) -> list[dict]:
    """The record's system prompt as a turn (none when absent); ``config.system_key`` names it."""
    system = obj.get(config.system_key)
    if system is None:
        return []
    if not isinstance(system, str):
        raise BadSample("not_a_string", f"[{config.system_key}]: expected a string, got {kind_name(system)}")
    return [{"role": "system", "content": system}]


# ---------------------------------------------------------------------------------------------------
# Rendering and tokenizing
# ---------------------------------------------------------------------------------------------------
class SampleEncoder:
    """Conversation -> (ids, loss mask) with one chat template and one tokenizer."""

    def __init__(self, tokenizer, template: ChatTemplate) -> None:
        self.tokenizer = tokenizer
        self.template = template
        # The raw tokenizers.Tokenizer gives character offsets; encode it without a post-processor's
        # BOS/EOS, as apply_chat_template does (the template writes its own).
        self._fast = (
            getattr(tokenizer, "tok", None) if hasattr(getattr(tokenizer, "tok", None), "encode") else None
        )

    def render(self, messages: list[dict]) -> tuple[str, list[tuple[int, int]]]:
        """The rendering and its assistant spans (a failing template is a :class:`BadSample`)."""
        try:
            return self.template.assistant_spans(messages)
        except TemplateRenderError as error:
            raise BadSample("template_error", str(error)) from None

    def encode(self, messages: list[dict]) -> tuple[np.ndarray, np.ndarray]:
        return self.encode_rendered([self.render(messages)])[0]

    def encode_rendered(
        self, rendered: list[tuple[str, list]], places: Sequence[str] | None = None
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """Tokenize many renderings in one call (``tokenizers`` runs a batch on all cores). ``places``
        (``file:line`` of each rendering): a tokenizer failure is an :class:`InputError` naming it."""
        if places is None:
            return self._encode_rendered(rendered)

        return guarded(
            lambda: self._encode_rendered(rendered),
            len(rendered),
            lambda i: self._encode_rendered(rendered[i : i + 1]),
            lambda i: places[i],
        )

    def _encode_rendered(self, rendered: list[tuple[str, list]]) -> list[tuple[np.ndarray, np.ndarray]]:
        if self._fast is None:
            return [self._encode_pieces(text, spans) for text, spans in rendered]
        encodings = self._fast.encode_batch([text for text, _ in rendered], add_special_tokens=False)
        out = []
        for encoding, (_, spans) in zip(encodings, rendered, strict=True):
            ids = np.asarray(encoding.ids, dtype=np.int64)
            out.append(
                (ids, mask_from_offsets(np.asarray(encoding.offsets, dtype=np.int64).reshape(-1, 2), spans))
            )
        return out

    def _encode_pieces(self, text: str, spans: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
        cuts, flags, pos = [], [], 0
        for start, end in spans:
            if start > pos:
                cuts.append(text[pos:start])
                flags.append(0)
            cuts.append(text[start:end])
            flags.append(1)
            pos = end
        if pos < len(text):
            cuts.append(text[pos:])
            flags.append(0)
        pieces = self.tokenizer.encode_batch(cuts) if cuts else []
        ids = np.fromiter((t for p in pieces for t in p), dtype=np.int64)
        mask = np.fromiter(
            (f for p, f in zip(pieces, flags, strict=True) for _ in p), dtype=np.uint8, count=ids.size
        )
        return ids, mask


def mask_from_offsets(offsets: np.ndarray, spans: list[tuple[int, int]]) -> np.ndarray:
    """1 for every token whose characters overlap an assistant span.

    Offsets of byte-level BPE can be trimmed (a token ' Hi' reports only 'Hi') or empty, so each token
    is taken to start where the previous one ended: tokens tile the text and none is lost at a span edge.
    """
    n = offsets.shape[0]
    mask = np.zeros(n, dtype=np.uint8)
    if n == 0 or not spans:
        return mask
    starts, ends = offsets[:, 0].copy(), offsets[:, 1].copy()
    prev_end = np.concatenate([[0], np.maximum.accumulate(ends)[:-1]])
    starts = np.minimum(starts, prev_end)
    ends = np.maximum(ends, starts + 1)
    for a, b in spans:
        if b > a:
            mask |= ((starts < b) & (ends > a)).astype(np.uint8)
    return mask


# ---------------------------------------------------------------------------------------------------
# Reading inputs
# ---------------------------------------------------------------------------------------------------
def counted(records: Iterator, desc: str, enabled: bool = True) -> Iterator:
    """``records`` as they are, counted on a progress line (:mod:`llmtools.progress`: silent when short)."""
    with Progress(None, desc, unit=" samples", enabled=enabled) as bar:
        for record in records:
            yield record
            bar.update(1)


def iter_records(config, inputs: list[dict], skipped: dict[str, int]) -> Iterator[tuple[str, object]]:
    """``(place, record)`` for every record of every input, in order; ``place`` is ``file:line``.

    ``config`` gives ``inputs``, ``skip_bad``, ``split`` and ``hf_columns()`` (an :class:`SftConfig`, or
    the preference pairs' config).

    Malformed lines are yielded as :class:`BadSample` (the caller decides: stop or count).
    ``inputs`` gets the sidecar entries of what was read.
    """
    for spec in config.inputs:
        if spec != "-" and looks_like_hf(spec):
            yield from _hf_records(spec, config, inputs)
        else:
            yield from _jsonl_records(spec, config, inputs, skipped)


def _jsonl_records(spec: str, config, inputs: list[dict], skipped: dict[str, int]):
    source = JsonlSource([spec], skip_bad=config.skip_bad)
    for chunk in source.batches():
        rows = chunk.data.split(b"\n")
        if not chunk.unterminated:
            rows.pop()
        for number, row in enumerate(rows, start=chunk.first_line):
            place = f"{chunk.source}:{number}"
            if not row.strip():
                skipped["blank_line"] = skipped.get("blank_line", 0) + 1
                continue
            try:
                record = jsonfile.parse_line(row, place, strings=True)
            except jsonfile.BadLine as error:
                yield place, BadSample(error.kind, error.what)
                continue
            yield place, record
    for kind, count in source.skipped.items():
        skipped[kind] = skipped.get(kind, 0) + count
    inputs.extend(source.inputs())


def _hf_records(spec: str, config, inputs: list[dict]):
    table = open_hf(spec, config.split)
    have = set(table.schema.names)
    needed, optional = config.hf_columns()
    table.check_columns(needed)
    columns = needed + [c for c in optional if c in have and c not in needed]
    row = 0
    for batch in table.batches(columns):
        for record in batch.to_pylist():
            row += 1
            yield f"{table.name}:row {row}", {k: v for k, v in record.items() if v is not None}
    inputs.extend(file_inputs(table.files))


# ---------------------------------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------------------------------
class Packer:
    """Greedy, in-order packing of samples into sequences of at most ``length`` tokens."""

    def __init__(self, length: int, emit) -> None:
        self.length, self.emit = length, emit
        self.ids: list[np.ndarray] = []
        self.masks: list[np.ndarray] = []

    def add(self, ids: np.ndarray, mask: np.ndarray) -> None:
        if self.ids and sum(x.size for x in self.ids) + ids.size > self.length:
            self.flush()
        self.ids.append(ids)
        self.masks.append(mask)

    def flush(self) -> None:
        if not self.ids:
            return
        segments = np.concatenate([np.full(x.size, k + 1, dtype=np.int64) for k, x in enumerate(self.ids)])
        self.emit(np.concatenate(self.ids), np.concatenate(self.masks), segments)
        self.ids, self.masks = [], []


def build_sft(config: SftConfig, progress: bool | None = None) -> SftResult:
    """Run the whole pipeline; outputs appear only if it succeeds (one writer per output prefix)."""
    with config.output() as output:
        return _build_sft(config, output, progress)


def _build_sft(config: SftConfig, output: DatasetOutput, progress: bool | None = None) -> SftResult:
    tokenizer = load_tokenizer(config.tokenizer, backend="tokenizers", special_tokens="split")
    template = load_chat_template(
        config.chat_template, config.tokenizer, time_limit=config.template_timeout, date=config.template_date
    )
    if config.append_eod and tokenizer.eod_id is None:
        raise UsageError(f"--append-eod: tokenizer {config.tokenizer} has no EOD token")
    encoder = SampleEncoder(tokenizer, template)
    dtypes = {"input_ids": dtype_for_vocab(tokenizer.vocab_size), "loss_mask": np.dtype(np.uint8)}
    dtypes["segment_ids"] = np.dtype(np.uint16 if (config.max_length or 0) < 65535 else np.int32)
    result = SftResult()
    result.split_markers = split_markers(template, tokenizer)
    inputs: list[dict] = []
    writers = {k: output.open(config.prefix_for(k), dtypes[k]) for k in config.keys}

    def write(ids: np.ndarray, mask: np.ndarray, segments: np.ndarray | None = None) -> None:
        writers["input_ids"].add_document(ids)
        writers["loss_mask"].add_document(mask)
        if segments is not None:
            writers["segment_ids"].add_document(segments)
        result.sequences += 1

    packer = Packer(config.max_length, write) if config.pack else None

    def add(ids: np.ndarray, mask: np.ndarray) -> None:
        if config.append_eod:
            ids = np.append(ids, tokenizer.eod_id)
            mask = np.append(mask, np.uint8(1))
        if config.max_length is not None and ids.size > config.max_length:
            if config.overflow == "drop" or not mask[: config.max_length].any():
                result.dropped_too_long += 1
                return
            ids, mask = ids[: config.max_length], mask[: config.max_length]
            result.truncated += 1
        result.samples += 1
        result.tokens += int(ids.size)
        result.target_tokens += int(mask.sum())
        if packer is not None:
            packer.add(ids, mask)
        else:
            write(ids, mask)

    pending: list[tuple[str, list]] = []  # rendered, waiting to be tokenized as one batch
    places: list[str] = []
    records = counted(iter_records(config, inputs, result.skipped), "llm-prep sft", progress is not False)
    for place, record in records:
        try:
            if isinstance(record, BadSample):
                raise record
            pending.append(encoder.render(to_messages(record, config)))
            places.append(place)
        except BadSample as bad:
            if not config.skip_bad:
                raise InputError(f"{place}: {bad}") from None
            result.skipped[bad.kind] = result.skipped.get(bad.kind, 0) + 1
            continue
        if len(pending) >= ENCODE_BATCH:
            for ids, mask in encoder.encode_rendered(pending, places):
                add(ids, mask)
            pending, places = [], []
    for ids, mask in encoder.encode_rendered(pending, places) if pending else []:
        add(ids, mask)
    if packer is not None:
        packer.flush()
    if result.samples == 0:
        raise InputError(
            f"{', '.join(config.inputs)}: no usable samples"
            + (f" (skipped: {_fmt_counts(result.skipped)})" if result.skipped else "")
        )
    for key in config.keys:
        output.set_sidecar(
            config.prefix_for(key),
            build_sft_sidecar(key, config, tokenizer, template, dtypes[key], inputs, result),
        )
    result.paths = [str(path) for path in output.commit()]
    return result


def _fmt_counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))


def build_sft_sidecar(
    key, config: SftConfig, tokenizer, template: ChatTemplate, dtype, inputs, result
) -> dict:
    """An ordinary indexed-dataset sidecar plus the ``sft`` block (schema ``sft-sidecar.schema.json``)."""
    return build_sidecar(
        tokenizer=tokenizer.identity(),
        dtype=dtype,
        inputs=inputs,
        documents=result.sequences,
        sequences=result.sequences,
        tokens=result.tokens,  # every dataset holds one value per token
        json_key=key,
        append_eod=config.append_eod,
        special_tokens="split",
        skipped=result.skipped,
        sft={
            "format": SFT_FORMAT,
            "version": 1,
            "role": key,
            "datasets": {k: os.path.basename(config.prefix_for(k)) for k in config.keys},
            "input_format": config.format,
            "chat_template": template.identity(),
            "mask": "loss_mask[t] = 1 where token t is a target (assistant turns, end-of-turn included)",
            "max_length": config.max_length,
            "overflow": config.overflow,
            "packed": bool(config.pack),
            "counts": result.counts(),
        },
    )
