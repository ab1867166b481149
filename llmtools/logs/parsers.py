"""Line parsers for the training logs we read, and the auto-detection that picks one per file.

Each parser turns one line into zero or more :class:`~llmtools.logs.records.Record` (canonical value
names) and says what kind of line it was. The formats are matched to what the trainers' source code
prints (the fixtures in ``tests/logs/fixtures/`` cite file and function):

* ``jsonl`` - llm-train's ``metrics.jsonl`` (``schemas/metrics.schema.json``).
* ``megatron`` - Megatron-LM ``megatron/training/training.py``: ``training_log()`` iteration lines,
  ``evaluate_and_print_results()`` validation lines; ``checkpointing.py`` load/save lines.
* ``deepspeed`` - DeepSpeed ``runtime/engine.py`` ``_report_progress()`` (``step=N, skipped=,
  lr=[..]``), ``utils/timer.py`` ``SynchronizedWallClockTimer.log()`` (``time (ms) | fwd: ..``) and
  ``ThroughputTimer.stop()``; ``runtime/pipe/engine.py`` ``train_batch()`` (``steps: N loss: ..``).
* ``mindformers`` - MindFormers ``core/callback/callback.py`` ``MFLossMonitor.print_output_info()``.
* ``generic`` - any ``key=value`` / ``key: value`` line, optionally selected by ``--pattern``.
"""

from __future__ import annotations

import math
import re
from datetime import datetime

from llmtools.errors import UsageError
from llmtools.formats import jsonfile
from llmtools.logs.records import KINDS, Record, slug

FORMATS = ("auto", "jsonl", "megatron", "deepspeed", "mindformers", "generic")
_NUM = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:nan|inf|infinity)"


def to_float(text: str) -> float | None:
    """A number as trainers print it: ``3.2E+00``, ``[1.e-05]``, ``1234ms``, ``12.3T``, ``nan``."""
    text = text.strip().strip("[]()").split(",")[0].strip()
    for suffix in ("ms", "GB", "T", "s"):
        if text.endswith(suffix):
            text = text[: -len(suffix)]
            break
    try:
        return float(text)
    except ValueError:
        return None


def _timestamp(text: str) -> float | None:
    """Local wall time of a ``2024-04-04 09:09:53,312`` / ``2026-09-11 12:06:52.987995`` stamp."""
    try:
        return datetime.fromisoformat(text.replace(",", ".")).timestamp()
    except ValueError:
        return None


class Parser:
    """One format. ``parse`` returns ``(line_kind, records)``; line_kind is train/eval/event/other/invalid."""

    name = "base"
    carried: tuple[str, ...] = ("last_time",)
    """The attributes a resumed reader needs to carry on mid-file (see :meth:`state`)."""

    def __init__(self) -> None:
        self.last_time: float | None = None

    def detect(self, line: str) -> bool:
        raise NotImplementedError

    def parse(self, line: str, number: int) -> tuple[str, list[Record]]:
        raise NotImplementedError

    def state(self) -> dict:
        """What a resumed reader needs to carry on mid-file (saved by ``llm-log tb``)."""
        return {name: getattr(self, name) for name in self.carried}

    def restore(self, state: dict) -> None:
        for name in self.carried:
            setattr(self, name, state.get(name))


_NUMBER_TYPES = (float, int)  # exact types: a bool is an int subclass and is handled on its own


# ---------------------------------------------------------------------------------------------
class JsonlParser(Parser):
    """llm-train's metrics.jsonl, one record per line (the metrics schema)."""

    name = "jsonl"
    _skip = frozenset(("kind", "step", "time", "event", "message"))

    def detect(self, line: str) -> bool:
        if not line.startswith("{"):
            return False
        try:
            data = jsonfile.loads(line)
        except ValueError:
            return False
        return isinstance(data, dict) and "step" in data

    def parse(self, line: str, number: int) -> tuple[str, list[Record]]:
        try:  # a name holding a lone surrogate ("\ud800") cannot be a tag in any writer: refused too
            data = jsonfile.parse_line(line, f"line {number}", strings=True)
        except jsonfile.BadLine as error:
            if not line.lstrip().startswith("{"):
                return "other", []
            message = error.what.replace("malformed", "not valid")
            return "invalid", [Record("invalid", 0, None, message=message)]
        if not isinstance(data, dict):
            return "invalid", [Record("invalid", 0, None, message="a JSON value that is not an object")]
        kind = data.get("kind", "train")
        step = data.get("step")
        if kind not in KINDS:
            return "invalid", [Record("invalid", 0, None, message=f"unknown kind {kind!r}")]
        if type(step) is not int or not 0 <= step < 2**63:
            shown = repr(step) if len(repr(step)) < 40 else f"{repr(step)[:37]}..."
            message = f"'step' must be an integer from 0 to 2**63-1, got {shown}"
            return "invalid", [Record("invalid", 0, None, message=message)]
        wall = data.get("time")
        if type(wall) not in _NUMBER_TYPES or not math.isfinite(_held(wall)):
            wall = None
        if kind == "event":
            name = data.get("event")
            if not isinstance(name, str):
                return "invalid", [Record("invalid", 0, None, message="event record without an 'event' name")]
            message = data.get("message")
            return "event", [Record("event", step, wall, event=name, message=str(message or ""), line=number)]
        skip = self._skip
        values = {k: _held(v) for k, v in data.items() if type(v) in _NUMBER_TYPES and k not in skip}
        if len(values) + len(data.keys() & skip) < len(data):
            # rare: some values are not plain numbers (a bool flag, a null, a string); look closer
            if kind == "train" and "loss" in data and data["loss"] is None:
                values["loss"] = math.nan  # llm-train writes a non-finite loss as null (strict JSON)
            for key, value in data.items():
                if type(value) is bool and key not in skip:
                    values[key] = 1.0 if value else 0.0
                elif type(value) is dict:  # a group of scalars, e.g. source_tokens: {source: tokens}
                    for name, item in value.items():
                        if type(item) in _NUMBER_TYPES:
                            values[f"{key}/{name}"] = _held(item)
            values.update(_moe_layer_values(data.get("moe_layers")))
        return kind, [Record(kind, step, wall, values, line=number)]


def _held(value) -> float:
    """A JSON number, kept as it is, except an integer beyond float range (400 digits): an infinity, as a
    float spelled that long is, never an OverflowError later."""
    try:
        float(value)
        return value
    except OverflowError:
        return math.inf if value > 0 else -math.inf


_MOE_LAYER_KEYS = ("cv", "max_load", "dropped", "aux_loss", "z_loss")


def _moe_layer_values(layers) -> dict[str, float]:
    """llm-train's per-layer router metrics (``moe_layers``) as scalars ``moe_layer<N>_<key>``."""
    values: dict[str, float] = {}
    if not isinstance(layers, list):
        return values
    for entry in layers:
        if not isinstance(entry, dict) or type(entry.get("layer")) is not int:
            continue
        for key in _MOE_LAYER_KEYS:
            if type(entry.get(key)) in _NUMBER_TYPES:
                values[f"moe_layer{entry['layer']}_{key}"] = _held(entry[key])
    return values


# ---------------------------------------------------------------------------------------------
_MEGATRON_NAMES = {
    "lm loss": "loss",
    "learning rate": "lr",
    "grad norm": "grad_norm",
    "consumed samples": "consumed_samples",
    "consumed tokens": "consumed_tokens",
    "global batch size": "global_batch_size",
    "loss scale": "loss_scale",
    "num zeros": "num_zeros",
    "params norm": "params_norm",
    "number of skipped iterations": "skipped_iterations",
    "number of nan iterations": "nan_iterations",
    "samples per second": "samples_per_s",
    "tokens per gpu per second(tgs)": "tokens_per_s_per_gpu",
    "tokens per gpu per second (tgs)": "tokens_per_s_per_gpu",
    "actual seqlen": "seq_length",
    "throughput per GPU (TFLOP/s/GPU)": "tflops_per_gpu",
    "TFLOPs": "tflops_per_gpu",
}
_MEGATRON_ITERATION = re.compile(r"\biteration\s+(\d+)\s*/\s*(\d+)\s*\|(.*)$")
_MEGATRON_STAMP = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)?)\]")
_MEGATRON_VALID = re.compile(r"\bvalidation(?:-(\S+))? loss at (.*?)\|(.*)$")
_MEGATRON_LOADED = re.compile(r"successfully loaded checkpoint from (\S+)")
_MEGATRON_LOADED_AT = re.compile(r"at iteration (\d+)")
_TOKEN = re.compile(r"\S+")
_MEGATRON_SAVED = re.compile(r"successfully saved checkpoint from iteration\s+(\d+) to (\S+)")
_STEP_IN_PREFIX = re.compile(r"iteration (\d+)")


def _search_validation(line: str) -> re.Match | None:
    """``_MEGATRON_VALID.search(line)`` in time linear in the line.

    Searched directly, every ``validation`` would rescan the rest of its word for " loss at " and the
    rest of the line for "|": quadratic in a line of repeated ``validation-`` (a 40 KB line took
    seconds). The match can only start in the word just before a " loss at ", at its leftmost
    ``validation`` that begins a word and ends it or is followed by ``-`` and a name, so each word is
    looked at once; the pattern is then matched at that one place (if its tail fails there, it fails
    at every later place too).
    """
    if " loss at " not in line:
        return None
    for token in _TOKEN.finditer(line):
        if not line.startswith(" loss at ", token.end()):
            continue
        i = line.find("validation", token.start(), token.end())
        while i != -1:
            end = i + len("validation")
            starts_word = i == 0 or not (line[i - 1].isalnum() or line[i - 1] == "_")
            if starts_word and (end == token.end() or (line[end] == "-" and end + 1 < token.end())):
                return _MEGATRON_VALID.match(line, i)
            i = line.find("validation", i + 1, token.end())
    return None


def _search_loaded(line: str) -> tuple[str, str] | None:
    """(path, iteration) of a "successfully loaded checkpoint from PATH ... at iteration N" line, linearly.

    As ``from (\\S+).*?at iteration (\\d+)`` would answer, without rescanning the line from every head: the
    word after the head, unless no "at iteration N" follows it (then only a word ending in "at" can be).
    """
    head = _MEGATRON_LOADED.search(line)
    if not head:
        return None
    at = _MEGATRON_LOADED_AT.search(line, head.end())
    if at:
        return head.group(1), at.group(1)
    inside = head.end() - 2
    at = _MEGATRON_LOADED_AT.match(line, inside) if inside > head.start(1) else None
    return (line[head.start(1) : inside], at.group(1)) if at else None


class MegatronParser(Parser):
    """Megatron-LM (and Megatron-DeepSpeed) ``training_log`` / ``evaluate_and_print_results`` lines."""

    name = "megatron"

    def detect(self, line: str) -> bool:
        return "iteration" in line and "|" in line and _MEGATRON_ITERATION.search(line) is not None

    def parse(self, line: str, number: int) -> tuple[str, list[Record]]:
        stamp = _MEGATRON_STAMP.search(line)
        if stamp:
            self.last_time = _timestamp(stamp.group(1)) or self.last_time
        match = _MEGATRON_ITERATION.search(line) if "iteration" in line and "|" in line else None
        if match and "validation" not in line[: match.start()]:
            values: dict[str, float] = {}
            for field in match.group(3).split("|"):
                key, sep, text = field.rpartition(":")
                if not sep:
                    continue
                key = key.strip()
                value = to_float(text)
                if value is None or not key:
                    continue
                if key == "elapsed time per iteration (ms)":
                    values["step_time_s"] = value / 1000.0
                elif key == "elapsed time per iteration (s)":
                    values["step_time_s"] = value
                else:
                    values[_MEGATRON_NAMES.get(key) or slug(key)] = value
            if "samples_per_s" not in values and values.get("step_time_s") and "global_batch_size" in values:
                values["samples_per_s"] = values["global_batch_size"] / values["step_time_s"]
            if "samples_per_s" in values and "seq_length" in values:
                # Megatron-DeepSpeed prints both; its own tokens/s is their product (training_log)
                values["tokens_per_s"] = values["samples_per_s"] * values["seq_length"]
            return "train", [Record("train", int(match.group(1)), self.last_time, values, line=number)]
        match = _search_validation(line)
        if match:
            where = _STEP_IN_PREFIX.search(match.group(2))
            if not where:
                return "other", []
            split = "test" if "test set" in match.group(2) else "eval"
            suffix = slug(match.group(1)) + "_" if match.group(1) else ""
            values = {}
            for field in match.group(3).split("|"):
                key, sep, text = field.rpartition(":")
                value = to_float(text) if sep else None
                if value is None:
                    continue
                key = key.strip()
                if key.endswith(" value"):
                    base, unit = key[: -len(" value")], "loss"
                elif key.endswith(" PPL"):
                    base, unit = key[: -len(" PPL")], "ppl"
                else:
                    continue
                stem = "" if base == "lm loss" else slug(base).removesuffix("_loss") + "_"
                values[f"{split}_{suffix}{stem}{unit}"] = value
            return "eval", [Record("eval", int(where.group(1)), self.last_time, values, line=number)]
        found = _search_loaded(line)
        if found:
            path, step = found
            message = f"resumed from {path} at iteration {step}"
            return "event", [
                Record("event", int(step), self.last_time, event="resume", message=message, line=number)
            ]
        match = _MEGATRON_SAVED.search(line)
        if match:
            message = f"saved checkpoint to {match.group(2)}"
            return "event", [
                Record(
                    "event",
                    int(match.group(1)),
                    self.last_time,
                    event="checkpoint",
                    message=message,
                    line=number,
                )
            ]
        return "other", []


# ---------------------------------------------------------------------------------------------
_DS_STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]")
_DS_PROGRESS = re.compile(r"\bstep=(\d+), skipped=(\d+), lr=\[")
_DS_TIMERS = re.compile(r"\btime \(ms\)((?: \| [^|:]+: " + f"(?:{_NUM}))+)")
_DS_THROUGHPUT = re.compile(
    r"epoch=(\d+)/micro_step=(\d+)/global_step=(\d+), RunningAvgSamplesPerSec=([^,]+), "
    r"CurrSamplesPerSec=([^,]+), MemAllocated=([^,]+?)GB, MaxMemAllocated=([^,\s]+?)GB"
)
# Each pattern's open-ended middle is found by a second search from where its head ended, never by a
# lazy or greedy ".*" inside one pattern: that would rescan the rest of the line from every place the
# head matches (quadratic in a line of repeated heads). If the tail is missing after the first head, it
# is missing after every later one, so one search of each is the same answer.
_DS_PIPE = re.compile(r"\bsteps: (\d+) loss: (" + _NUM + r") ")
_DS_PIPE_TAIL = re.compile(r"iter time \(s\): (" + _NUM + r") samples/sec: (" + _NUM + ")")
_DS_EXTRA = re.compile(r"(?<!\S)(\S+): (" + _NUM + ")")


def _ds_progress(line: str) -> tuple[re.Match, int] | None:
    """The progress line's head and the position of the "]" closing its learning rates."""
    match = _DS_PROGRESS.search(line)
    close = line.find("]", match.end()) if match else -1
    return (match, close) if close != -1 else None


def _ds_pipe(line: str) -> tuple[re.Match, re.Match] | None:
    """A pipeline-engine line's head and tail (steps and loss; iteration time and samples/s)."""
    match = _DS_PIPE.search(line)
    tail = _DS_PIPE_TAIL.search(line, match.end()) if match else None
    return (match, tail) if tail else None


class DeepSpeedParser(Parser):
    """DeepSpeed's own progress lines (``steps_per_print``), wall-clock timers and throughput timer.

    Timer lines carry no step: they belong to the last step DeepSpeed reported, and only the
    first timer line of each name per step is kept (they print every step, reports every N).
    """

    name = "deepspeed"
    carried = ("last_time", "last_step")

    def __init__(self) -> None:
        super().__init__()
        self.last_step: int | None = None
        self.timed: set[str] = set()

    def detect(self, line: str) -> bool:
        return bool(_ds_progress(line) or _DS_THROUGHPUT.search(line) or _ds_pipe(line))

    def _at(self, step: int) -> None:
        if step != self.last_step:
            self.last_step = step
            self.timed = set()

    def parse(self, line: str, number: int) -> tuple[str, list[Record]]:
        stamp = _DS_STAMP.match(line)
        if stamp:
            self.last_time = _timestamp(stamp.group(1)) or self.last_time
        if "step=" in line:
            found = _ds_progress(line)
            if found:
                match, close = found
                step = int(match.group(1))
                self._at(step)
                values = {"skipped_steps": float(match.group(2))}
                lrs = [to_float(x) for x in line[match.end() : close].split(",") if x.strip()]
                if lrs and lrs[0] is not None:
                    values["lr"] = lrs[0]
                return "train", [Record("train", step, self.last_time, values, line=number)]
            match = _DS_THROUGHPUT.search(line)
            if match:
                step = int(match.group(3))
                self._at(step)
                values = {}
                for name, text in (
                    ("avg_samples_per_s", match.group(4)),
                    ("samples_per_s", match.group(5)),
                    ("memory_mb", match.group(6)),
                    ("max_memory_mb", match.group(7)),
                ):
                    value = to_float(text)
                    if value is not None and not (name == "avg_samples_per_s" and value == -math.inf):
                        values[name] = value * 1024.0 if name.endswith("memory_mb") else value
                return "train", [Record("train", step, self.last_time, values, line=number)]
        if "time (ms)" in line:
            match = _DS_TIMERS.search(line)
            if match and self.last_step is not None:
                values = {}
                for field in match.group(1).split("|"):
                    key, sep, text = field.rpartition(":")
                    name = "time_" + slug(key) + "_ms"
                    value = to_float(text) if sep else None
                    if value is not None and name not in self.timed:
                        values[name] = value
                        self.timed.add(name)
                if values:
                    return "train", [Record("train", self.last_step, self.last_time, values, line=number)]
            return "other", []
        if "steps: " in line:
            found = _ds_pipe(line)
            if found:
                match, tail = found
                step = int(match.group(1))
                self._at(step)
                values = {
                    "loss": float(match.group(2)),
                    "step_time_s": float(tail.group(1)),
                    "samples_per_s": float(tail.group(2)),
                }
                # a name starts a word: from inside a word the search would rescan it (quadratic)
                for extra in _DS_EXTRA.finditer(line, match.end(), tail.start()):
                    values[slug(extra.group(1))] = float(extra.group(2))
                return "train", [Record("train", step, self.last_time, values, line=number)]
        return "other", []


# ---------------------------------------------------------------------------------------------
_MF_STAMP = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})")
_MF_LINE = re.compile(
    r"\{ Epoch:\[\s*(\d+)/\s*(\d+)\], step:\[\s*(\d+)/\s*(\d+)\], "
    r"loss:\s*(?:\[\s*([^/\]]+)/\s*([^\]]+)\]|([^,]+)),(.*)$"
)
_MF_PROGRESS = re.compile(r"%\s*\|")
_MF_PROGRESS_TAIL = re.compile(r"\|\s*(" + _NUM + r") samples/s/p")
# possessive: a comma followed by a long run of spaces would otherwise be retried space by space
_MF_FIELD_SPLIT = re.compile(r",\s++(?=[a-z_ ]+:)")
_MF_NAMES = {
    "per_step_time": "step_time_s",
    "lr": "lr",
    "loss_scale": "loss_scale",
    "global_norm": "grad_norm",
    "train_throughput_per_npu": "tflops_per_device",
}


class MindFormersParser(Parser):
    """MindFormers ``MFLossMonitor`` lines (``{ Epoch:[..], step:[..], loss: .., per_step_time: ..ms``)."""

    name = "mindformers"
    carried = ("last_time", "last_step")

    def __init__(self) -> None:
        super().__init__()
        self.last_step: int | None = None

    def detect(self, line: str) -> bool:
        return "{ Epoch:[" in line and _MF_LINE.search(line) is not None

    def parse(self, line: str, number: int) -> tuple[str, list[Record]]:
        stamp = _MF_STAMP.search(line)
        if stamp:
            self.last_time = _timestamp(stamp.group(1)) or self.last_time
        if "{ Epoch:[" in line:
            match = _MF_LINE.search(line)
            if not match:
                return "other", []
            epoch, _, step_in_epoch, steps_per_epoch = (int(match.group(i)) for i in range(1, 5))
            # the global step, as print_output_info computes it for TensorBoard
            step = step_in_epoch + (epoch - 1) * steps_per_epoch
            values: dict[str, float] = {}
            loss = to_float(match.group(5) if match.group(5) is not None else match.group(7))
            if loss is not None:
                values["loss"] = loss
            if match.group(6) is not None and to_float(match.group(6)) is not None:
                values["loss_avg"] = to_float(match.group(6))
            for field in _MF_FIELD_SPLIT.split(match.group(8).strip()):
                key, sep, text = field.partition(":")
                value = to_float(text) if sep else None
                if value is None:
                    continue
                name = _MF_NAMES.get(key.strip()) or slug(key)
                values[name] = value / 1000.0 if name == "step_time_s" else value
            self.last_step = step
            return "train", [Record("train", step, self.last_time, values, line=number)]
        if "samples/s/p" in line and self.last_step is not None:
            head = _MF_PROGRESS.search(line)
            # the pattern's greedy ".*" took the last rate on the line: the last tail after the head
            tails = _MF_PROGRESS_TAIL.finditer(line, head.end()) if head else ()
            match = next(reversed(list(tails)), None)
            if match:
                values = {"samples_per_s_per_device": float(match.group(1))}
                return "train", [Record("train", self.last_step, self.last_time, values, line=number)]
        return "other", []


# ---------------------------------------------------------------------------------------------
_KV = re.compile(r"(?<![\w./-])([A-Za-z_][\w./-]*)\s*(?:=|:)\s*\[?(" + _NUM + r")\]?(?![\w.])")
_STEP_KEYS = ("step", "global_step", "iteration", "iter", "it", "steps")
_GENERIC_NAMES = {"learning_rate": "lr", "grad_norm": "grad_norm", "gradnorm": "grad_norm", "lm_loss": "loss"}


class GenericParser(Parser):
    """``key=value`` / ``key: value`` lines with a step key; ``pattern`` selects (and may name) fields.

    With named groups in ``pattern`` the groups are the fields (one must be a step key); without,
    the pattern only selects lines and the pairs are taken from the whole line.
    """

    name = "generic"

    def __init__(self, pattern: str | None = None) -> None:
        super().__init__()
        try:
            self.pattern = re.compile(pattern) if pattern else None
        except re.error as error:
            raise UsageError(f"--pattern: not a valid regular expression ({error})") from None

    def detect(self, line: str) -> bool:
        return self.parse(line, 0)[0] == "train"

    def parse(self, line: str, number: int) -> tuple[str, list[Record]]:
        fields: dict[str, str]
        if self.pattern is not None:
            match = self.pattern.search(line)
            if not match:
                return "other", []
            named = {k: v for k, v in match.groupdict().items() if v is not None}
            fields = named or {m.group(1): m.group(2) for m in _KV.finditer(line)}
        else:
            fields = {m.group(1): m.group(2) for m in _KV.finditer(line)}
        values: dict[str, float] = {}
        step = None
        for key, text in fields.items():
            name = slug(key)
            value = to_float(text)
            if value is None:
                continue
            if step is None and name in _STEP_KEYS and 0 <= value < 2**63 and value == int(value):
                step = int(value)
                continue
            values[_GENERIC_NAMES.get(name, name)] = value
        if step is None or not values:
            return "other", []
        return "train", [Record("train", step, self.last_time, values, line=number)]


def make_parser(name: str, pattern: str | None = None) -> Parser:
    if name == "jsonl":
        return JsonlParser()
    if name == "megatron":
        return MegatronParser()
    if name == "deepspeed":
        return DeepSpeedParser()
    if name == "mindformers":
        return MindFormersParser()
    if name == "generic":
        return GenericParser(pattern)
    raise UsageError(f"--format: unknown format {name!r} (choose from {', '.join(FORMATS)})")


# Auto-detection order: the richest format first (a Megatron-DeepSpeed log also has DeepSpeed lines).
DETECTION_ORDER = ("jsonl", "megatron", "mindformers", "deepspeed")
_DETECTORS = {name: make_parser(name) for name in DETECTION_ORDER}
_GENERIC = GenericParser()
GENERIC_MIN_LINES = 3


def detect_format(lines: list[str], allow_generic: bool = True) -> str | None:
    """The format of a log, from a sample of its lines, or None when no line is a metric line.

    ``generic`` is the last resort, and only when several sampled lines are ``key=value`` lines
    with a step (one such line in a config dump must not turn a whole log into metrics).
    """
    hits = dict.fromkeys(DETECTION_ORDER, 0)
    generic = 0
    for line in lines:
        for name in DETECTION_ORDER:
            if _DETECTORS[name].detect(line):
                hits[name] += 1
                break
        else:
            if allow_generic and ("=" in line or ":" in line) and _GENERIC.detect(line):
                generic += 1
    # The first format in DETECTION_ORDER with any hit wins, not the most frequent one: in a
    # Megatron-DeepSpeed log DeepSpeed's lines can outnumber Megatron's richer iteration lines.
    for name in DETECTION_ORDER:
        if hits[name]:
            return name
    return "generic" if generic >= GENERIC_MIN_LINES else None
