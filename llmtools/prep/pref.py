"""Preference pairs -> aligned chosen / rejected token and loss-mask datasets with one shared prompt (DPO data).

Pipeline (the rendering and tokenizing are ``llm-prep sft``'s own: :class:`~llmtools.prep.sft.SampleEncoder`)::

    read records (JSONL / local HF dataset, as llm-prep sft reads them)  ->  to_pair (validated)
      ->  render prompt + chosen and prompt + rejected with the chat template, completion spans
      ->  tokenize each whole rendering  ->  mask = 1 on completion tokens  ->  the shared prompt, checked
      ->  --max-prompt-length, --max-length  ->  PREFIX_{chosen,rejected}_{input_ids,loss_mask}_document

A record is one of the shapes TRL's preference datasets hold:

* ``{"prompt": str, "chosen": str, "rejected": str, "system"?: str}``: the prompt becomes a user turn
  (after the system turn, if any), each answer an assistant turn;
* ``{"prompt": [messages], "chosen": [messages], "rejected": [messages]}``: explicit prompt, the
  completions are the messages that follow it;
* ``{"chosen": [messages], "rejected": [messages]}``: implicit prompt, the longest common run of
  leading messages (TRL's ``extract_prompt``); a string ``prompt`` beside them is ignored, as in TRL.

Output (schema ``schemas/pref-sidecar.schema.json``): four MMIDIDX datasets, document ``j`` of each
being pair ``j``. ``PREFIX_chosen_input_ids_document`` holds prompt + chosen completion,
``PREFIX_chosen_loss_mask_document`` (uint8) is 1 on the completion's assistant tokens (end-of-turn
included) and 0 on the prompt; likewise for ``rejected``. Both sequences start with the same prompt
tokens (checked pair by pair: a template or tokenizer that renders the prompt differently before the
two completions is a bad pair, ``prompt_mismatch``). ``PREFIX_chosen`` is itself an ``llm-prep sft``
prefix, so the chosen answers can be fine-tuned on with ``task: sft``.

Truncation (tokens; the prompt first, then the response):

1. ``max_prompt_length``: a longer prompt keeps its LAST ``max_prompt_length`` tokens (the turns nearest
   the answer), as TRL's ``max_prompt_length`` did up to v0.28.
2. ``max_length``: a pair whose (shortened) prompt alone has ``max_length`` tokens or more is dropped (no
   completion token would remain), as TRL >= 0.29 drops it; otherwise each sequence longer than
   ``max_length`` keeps its FIRST ``max_length`` tokens (the response loses its end: TRL's
   ``truncation_mode="keep_start"``, its only mode since v0.29), or with ``overflow="drop"`` the pair
   is dropped.

Bad records (kind = key in the sidecar's ``counts.skipped``): those of ``llm-prep sft``
(``malformed_json``, ``invalid_utf8``, ``not_an_object``, ``missing_key``, ``not_a_string``,
``bad_messages``, ``unknown_role``, ``template_error``) and ``mixed_types`` (one answer a string, the other
messages), ``empty_completion`` (no assistant turn with content after the prompt), ``same_answers``
(chosen and rejected are the same), ``prompt_mismatch``.
The first stops the run with ``file:line: what is wrong`` (exit 2, no output); ``skip_bad`` counts them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from llmtools.errors import InputError, UsageError
from llmtools.formats.indexed import dtype_for_vocab
from llmtools.formats.output_marks import check_output_prefix
from llmtools.formats.pref_layout import KEYS, PREF_FORMAT, SIDES
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
from llmtools.prep.sft import (
    OVERFLOW,
    BadSample,
    SampleEncoder,
    check_messages,
    iter_records,
    kind_name,
    system_turn,
)
from llmtools.prep.sft import (
    counted as count_progress,
)
from llmtools.prep.template_sandbox import check_date, has_generation_blocks
from llmtools.tokenize import load_tokenizer

ENCODE_BATCH = 128  # pairs rendered per tokenizer call (two renderings each)
TRUNCATION = (
    "prompt first: a prompt over max_prompt_length keeps its last max_prompt_length tokens; then a pair whose "
    "prompt has max_length tokens or more is dropped, and a sequence over max_length keeps its first "
    "max_length tokens (overflow=drop drops the pair instead)"
)


@dataclass
class PrefConfig:
    """What ``llm-prep pref`` does; each field names its flag in errors."""

    inputs: list[str]
    tokenizer: str
    output_prefix: str
    chat_template: str | None = None
    prompt_key: str = "prompt"
    chosen_key: str = "chosen"
    rejected_key: str = "rejected"
    system_key: str = "system"
    system_prompt: str | None = None
    max_length: int | None = None
    max_prompt_length: int | None = None
    overflow: str = "truncate"
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
        if not self.inputs:
            raise UsageError("INPUT: give at least one input file or dataset")
        if not (0 < self.template_timeout <= 86400):
            raise UsageError(
                f"--template-timeout: must be between 0 and 86400 seconds, got {self.template_timeout}"
            )
        if self.overflow not in OVERFLOW:
            raise UsageError(
                f"--overflow: unknown policy {self.overflow!r} (choose one of {', '.join(OVERFLOW)})"
            )
        for flag, value in (
            ("--max-length", self.max_length),
            ("--max-prompt-length", self.max_prompt_length),
        ):
            if value is not None and value < 1:
                raise UsageError(f"{flag}: must be at least 1, got {value}")
        if (
            self.max_length is not None
            and self.max_prompt_length is not None
            and self.max_prompt_length >= self.max_length
        ):
            raise UsageError(
                f"--max-prompt-length: {self.max_prompt_length} leaves no room for the response within "
                f"--max-length {self.max_length}"
            )
        if len({self.prompt_key, self.chosen_key, self.rejected_key}) != 3:
            raise UsageError("--prompt-key, --chosen-key, --rejected-key: must be three different keys")

        check_output_prefix(self.output_prefix, "--output")

    def prefix_for(self, key: str) -> str:
        return f"{self.output_prefix}_{key}_document"

    @property
    def keys(self) -> tuple[str, ...]:
        return KEYS

    def output(self) -> DatasetOutput:
        """What this run writes: ``.bin``, ``.idx`` and sidecar per dataset."""
        return DatasetOutput([self.prefix_for(k) for k in self.keys], force=self.force)

    def hf_columns(self) -> tuple[list[str], list[str]]:
        """The columns an HF dataset input must have, and those read when present."""
        return [self.chosen_key, self.rejected_key], [self.prompt_key, self.system_key]


@dataclass
class PrefResult:
    paths: list[str] = field(default_factory=list)
    pairs: int = 0  # written
    chosen_tokens: int = 0  # of the chosen sequences, prompts included
    rejected_tokens: int = 0
    prompt_tokens: int = 0  # of the shared prompts, counted once per pair
    chosen_target_tokens: int = 0
    rejected_target_tokens: int = 0
    prompt_truncated: int = 0
    truncated: int = 0  # pairs with a sequence cut at max_length
    dropped_too_long: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    split_markers: list[str] = field(default_factory=list)  # template markers the tokenizer lacks

    @property
    def tokens(self) -> int:
        return self.chosen_tokens + self.rejected_tokens

    def counts(self) -> dict:
        return {
            "pairs": self.pairs,
            "tokens": self.tokens,
            "chosen_tokens": self.chosen_tokens,
            "rejected_tokens": self.rejected_tokens,
            "prompt_tokens": self.prompt_tokens,
            "chosen_target_tokens": self.chosen_target_tokens,
            "rejected_target_tokens": self.rejected_target_tokens,
            "prompt_truncated": self.prompt_truncated,
            "truncated": self.truncated,
            "dropped_too_long": self.dropped_too_long,
            "skipped": dict(self.skipped),
        }

    def to_dict(self) -> dict:
        return {"paths": list(self.paths), **self.counts()}

    def summary(self) -> str:
        bad = sum(v for k, v in self.skipped.items() if k != "blank_line")
        return (
            f"{self.pairs} pairs, {self.tokens} tokens ({self.chosen_target_tokens} chosen / "
            f"{self.rejected_target_tokens} rejected trained), {self.prompt_truncated} prompts shortened, "
            f"{self.truncated} truncated, {self.dropped_too_long} dropped as too long, {bad} bad skipped"
            + split_note(self.split_markers)
        )


@dataclass
class Pair:
    """One preference pair as conversations: the shared prompt and each side's completion messages."""

    prompt: list[dict]
    chosen: list[dict]
    rejected: list[dict]


# ---------------------------------------------------------------------------------------------------
# Records -> pairs
# ---------------------------------------------------------------------------------------------------
def to_pair(obj, config: PrefConfig) -> Pair:
    """One input record as a validated :class:`Pair` (raises :class:`BadSample`, without the place)."""
    if not isinstance(obj, dict):
        raise BadSample("not_an_object", f"expected a JSON object, got {type(obj).__name__}")
    answers = []
    for key in (config.chosen_key, config.rejected_key):
        if key not in obj:
            have = ", ".join(map(repr, obj)) or "none"
            raise BadSample("missing_key", f"missing key {key!r} (have {have})")
        if not isinstance(obj[key], (str, list)):
            raise BadSample(
                "not_a_string", f"[{key}]: expected a string or a list of messages, got {kind_name(obj[key])}"
            )
        answers.append(obj[key])
    chosen, rejected = answers
    if isinstance(chosen, str) != isinstance(rejected, str):
        raise BadSample(
            "mixed_types",
            f"[{config.chosen_key}] and [{config.rejected_key}]: one is a string, the other a list of messages",
        )
    prompt = obj.get(config.prompt_key)
    if isinstance(chosen, str):
        if config.prompt_key not in obj:
            raise BadSample(
                "missing_key", f"missing key {config.prompt_key!r} (string answers need a prompt)"
            )
        if not isinstance(prompt, str):
            raise BadSample(
                "not_a_string", f"[{config.prompt_key}]: expected a string, got {kind_name(prompt)}"
            )
        pair = Pair(
            system_turn(obj, config) + [{"role": "user", "content": prompt}],
            [{"role": "assistant", "content": chosen}],
            [{"role": "assistant", "content": rejected}],
        )
    else:
        chosen = check_messages(chosen, config.chosen_key)
        rejected = check_messages(rejected, config.rejected_key)
        if isinstance(prompt, list):  # explicit prompt
            pair = Pair(check_messages(prompt, config.prompt_key), chosen, rejected)
        else:  # implicit: the longest common run of leading messages (TRL's extract_prompt)
            shared = 0
            while shared < min(len(chosen), len(rejected)) and chosen[shared] == rejected[shared]:
                shared += 1
            pair = Pair(chosen[:shared], chosen[shared:], rejected[shared:])
        if not any(m["role"] == "system" for m in pair.prompt):
            pair.prompt = system_turn(obj, config) + pair.prompt
    if config.system_prompt is not None and not any(m["role"] == "system" for m in pair.prompt):
        pair.prompt.insert(0, {"role": "system", "content": config.system_prompt})
    for side, key in (("chosen", config.chosen_key), ("rejected", config.rejected_key)):
        completion = getattr(pair, side)
        if not any(m["role"] == "assistant" and m["content"].strip() for m in completion):
            raise BadSample(
                "empty_completion",
                f"[{key}]: no assistant turn with content after the prompt (nothing to compare)",
            )
    if pair.chosen == pair.rejected:
        raise BadSample(
            "same_answers",
            f"[{config.chosen_key}] and [{config.rejected_key}] are the same answer (a pair prefers one of two)",
        )
    return pair


def _add(result: PrefResult, name: str, n) -> None:
    setattr(result, name, getattr(result, name) + int(n))


# ---------------------------------------------------------------------------------------------------
# Rendering: prompt + completion through llm-prep sft's encoder, masked on the completion only
# ---------------------------------------------------------------------------------------------------
def render_side(encoder: SampleEncoder, prompt: list[dict], completion: list[dict]) -> tuple[str, list]:
    """The rendering of ``prompt + completion`` and the spans of the completion's assistant turns (the
    prompt's own assistant turns, in a multi-turn prompt, are context: not trained)."""
    text, spans = encoder.render(prompt + completion)
    if not has_generation_blocks(encoder.template.text):
        in_prompt = sum(m["role"] == "assistant" for m in prompt)  # one span per assistant message
        return text, spans[in_prompt:]
    # A template's own {% generation %} blocks need not be one per assistant message (none for some, several
    # for others): the completion's are those that start where the prompt's rendering ends.
    try:
        prompt_end = len(encoder.template.render(prompt))
    except TemplateRenderError as error:
        raise BadSample("template_error", str(error)) from None
    return text, [span for span in spans if span[0] >= prompt_end]


def shared_prompt_length(
    chosen: tuple[np.ndarray, np.ndarray], rejected: tuple[np.ndarray, np.ndarray]
) -> int:
    """Tokens of the prompt both sequences start with (before each one's first masked token); raises
    ``prompt_mismatch`` when the two renderings do not share it token for token."""
    lengths = []
    for side, (_, mask) in zip(SIDES, (chosen, rejected), strict=True):
        hits = np.flatnonzero(mask)
        if not hits.size:
            raise BadSample("empty_completion", f"the template renders no token of the {side} answer")
        lengths.append(int(hits[0]))
    p = lengths[0]
    if lengths[0] != lengths[1] or not np.array_equal(chosen[0][:p], rejected[0][:p]):
        first = int(np.argmax(chosen[0][: min(lengths)] != rejected[0][: min(lengths)]))
        raise BadSample(
            "prompt_mismatch",
            f"the chosen and rejected renderings do not share the prompt ({lengths[0]} vs {lengths[1]} prompt "
            f"tokens, first difference at token {first}): the template or tokenizer renders the prompt "
            "differently before the two answers",
        )
    return p


def truncate_pair(
    chosen: tuple[np.ndarray, np.ndarray],
    rejected: tuple[np.ndarray, np.ndarray],
    prompt_length: int,
    config: PrefConfig,
    result: PrefResult,
) -> tuple[list[tuple[np.ndarray, np.ndarray]], int] | None:
    """The module's truncation rules on one tokenized pair; None when the pair is dropped (counted)."""
    sides = [chosen, rejected]
    p = prompt_length
    if config.max_prompt_length is not None and p > config.max_prompt_length:
        cut = p - config.max_prompt_length
        sides = [(ids[cut:], mask[cut:]) for ids, mask in sides]
        p = config.max_prompt_length
        result.prompt_truncated += 1
    limit = config.max_length
    if limit is not None:
        if p >= limit:
            result.dropped_too_long += 1
            return None
        if any(ids.size > limit for ids, _ in sides):
            if config.overflow == "drop":
                result.dropped_too_long += 1
                return None
            sides = [(ids[:limit], mask[:limit]) for ids, mask in sides]
            result.truncated += 1
    return sides, p


# ---------------------------------------------------------------------------------------------------
# The whole pipeline
# ---------------------------------------------------------------------------------------------------
def build_pref(config: PrefConfig) -> PrefResult:
    """Run the whole pipeline; outputs appear only if it succeeds (one writer per output prefix), all four
    datasets and their sidecars committed as one step."""
    with config.output() as output:
        return _build_pref(config, output)


def _build_pref(config: PrefConfig, output: DatasetOutput) -> PrefResult:
    tokenizer = load_tokenizer(config.tokenizer, backend="tokenizers", special_tokens="split")
    template = load_chat_template(
        config.chat_template, config.tokenizer, time_limit=config.template_timeout, date=config.template_date
    )
    encoder = SampleEncoder(tokenizer, template)
    ids_dtype = dtype_for_vocab(tokenizer.vocab_size)
    dtypes = {key: (ids_dtype if key.endswith("input_ids") else np.dtype(np.uint8)) for key in KEYS}
    result = PrefResult()
    result.split_markers = split_markers(template, tokenizer)
    inputs: list[dict] = []

    def bad(place: str, error: BadSample) -> None:
        if not config.skip_bad:
            raise InputError(f"{place}: {error}") from None
        result.skipped[error.kind] = result.skipped.get(error.kind, 0) + 1

    writers = {k: output.open(config.prefix_for(k), dtypes[k]) for k in KEYS}

    def add(place: str, chosen, rejected) -> None:
        try:
            p = shared_prompt_length(chosen, rejected)
        except BadSample as error:
            bad(place, error)
            return
        kept = truncate_pair(chosen, rejected, p, config, result)
        if kept is None:
            return
        sides, p = kept
        for side, (ids, mask) in zip(SIDES, sides, strict=True):
            writers[f"{side}_input_ids"].add_document(ids)
            writers[f"{side}_loss_mask"].add_document(mask)
            _add(result, f"{side}_tokens", ids.size)
            _add(result, f"{side}_target_tokens", mask.sum())
        result.pairs += 1
        result.prompt_tokens += p

    def flush(pending: list) -> None:
        encoded = encoder.encode_rendered(
            [r for _, pair in pending for r in pair], [place for place, _ in pending for _ in (0, 1)]
        )
        for k, (place, _) in enumerate(pending):
            add(place, encoded[2 * k], encoded[2 * k + 1])

    pending: list[tuple[str, tuple]] = []  # rendered pairs waiting to be tokenized as one batch
    for place, record in count_progress(iter_records(config, inputs, result.skipped), "llm-prep pref"):
        try:
            if isinstance(record, BadSample):
                raise record
            pair = to_pair(record, config)
            pending.append(
                (
                    place,
                    (
                        render_side(encoder, pair.prompt, pair.chosen),
                        render_side(encoder, pair.prompt, pair.rejected),
                    ),
                )
            )
        except BadSample as error:
            bad(place, error)
            continue
        if len(pending) >= ENCODE_BATCH:
            flush(pending)
            pending = []
    if pending:
        flush(pending)
    if result.pairs == 0:
        counted = {k: v for k, v in result.skipped.items() if v}
        detail = ", ".join(f"{k} {v}" for k, v in sorted(counted.items()))
        if result.dropped_too_long:
            detail = ", ".join(filter(None, [detail, f"dropped as too long {result.dropped_too_long}"]))
        raise InputError(f"{', '.join(config.inputs)}: no usable pairs" + (f" ({detail})" if detail else ""))
    # A signal cannot leave one side without the other, or a dataset without its sidecar.
    for key in KEYS:
        output.set_sidecar(
            config.prefix_for(key),
            build_pref_sidecar(key, config, tokenizer, template, dtypes[key], inputs, result),
        )
    result.paths = [str(path) for path in output.commit()]
    return result


def build_pref_sidecar(
    key: str,
    config: PrefConfig,
    tokenizer,
    template: ChatTemplate,
    dtype,
    inputs: list[dict],
    result: PrefResult,
) -> dict:
    """An ordinary indexed-dataset sidecar plus the ``pref`` block (schema ``pref-sidecar.schema.json``)."""
    side = key.split("_", 1)[0]
    return build_sidecar(
        tokenizer=tokenizer.identity(),
        dtype=dtype,
        inputs=inputs,
        documents=result.pairs,
        sequences=result.pairs,
        tokens=getattr(result, f"{side}_tokens"),  # each dataset of a side holds one value per token
        json_key=key,
        append_eod=False,
        special_tokens="split",
        skipped=result.skipped,
        pref={
            "format": PREF_FORMAT,
            "version": 1,
            "role": key,
            "side": side,
            "datasets": {k: os.path.basename(config.prefix_for(k)) for k in KEYS},
            "chat_template": template.identity(),
            "mask": "loss_mask[t] = 1 where token t belongs to the completion's assistant turns (end-of-turn "
            "included); 0 on the shared prompt",
            "max_length": config.max_length,
            "max_prompt_length": config.max_prompt_length,
            "overflow": config.overflow,
            "truncation": TRUNCATION,
            "counts": result.counts(),
        },
    )
