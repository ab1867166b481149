"""A tokenizer is untrusted input, and so is what it does while encoding.

A ``tokenizer.json`` can hold a pre-tokenizer regex that backtracks catastrophically: ``tokenizers``
then panics in Rust. The panic arrives as ``pyo3_runtime.PanicException`` (a ``BaseException``, so it
passes ``except Exception``), cannot be pickled back from a worker process (a ``PicklingError`` naming
nothing), and Rust's panic hook prints its message and a backtrace straight onto file descriptor 2.

:func:`encode_located` encodes a batch with the native stderr held aside; a failure becomes one
:class:`InputError` naming the input file and the line of the first text the tokenizer fails on (found
by encoding the batch's texts one at a time, only after a failure), and what the tokenizer printed is
dropped. On success what was printed is passed on unchanged.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

from llmtools.errors import InputError, LlmtoolsError, where

T = TypeVar("T")


def is_tokenizer_failure(error: BaseException) -> bool:
    """A panic inside a native tokenizer, or any other exception it raised (not ours, not a signal)."""
    if type(error).__name__ == "PanicException":
        return True
    return isinstance(error, Exception) and not isinstance(error, LlmtoolsError | MemoryError)


@contextlib.contextmanager
def _native_stderr_held() -> Iterator[list]:
    """File descriptor 2 into a temporary file for the block; the caller decides whether to replay it
    (``held[0]`` is True on success)."""
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # no real stderr (embedded, captured): nothing to hold
        yield [True]
        return
    try:
        spool = tempfile.TemporaryFile()  # noqa: SIM115 - closed by the with below
    except OSError:  # no room for one (a full /tmp): encode without holding the native messages back
        yield [True]
        return
    sys.stderr.flush()
    saved = os.dup(fd)
    outcome = [False]
    with spool:
        os.dup2(spool.fileno(), fd)
        try:
            yield outcome
        finally:
            sys.stderr.flush()
            os.dup2(saved, fd)
            os.close(saved)
            if outcome[0]:
                spool.seek(0)
                data = spool.read()
                if data:
                    os.write(fd, data)


def _summary(error: BaseException) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    kind = "panicked" if type(error).__name__ == "PanicException" else f"raised {type(error).__name__}"
    return f"{kind}: {text[:200]}"


def batch_places(batches: Sequence) -> Callable[[int], str]:
    """``file:line`` of text i of DocBatches joined in order."""
    spans = [(len(b), b.source or "<input>", list(b.lines)) for b in batches]

    def place(i: int) -> str:
        for n, source, lines in spans:
            if i < n:
                return where(source, lines[i] if i < len(lines) else None)
            i -= n
        return "<input>"

    return place


def encode_located(tokenizer, texts, place: Callable[[int], str], hold_stderr: bool = True):
    """``tokenizer.encode_flat(texts, None)``; a tokenizer failure as an :class:`InputError` naming
    ``place(i)`` of the first text i it fails on. ``hold_stderr=False`` where several threads encode at
    once (one file descriptor 2 cannot be held for each)."""
    return guarded(
        lambda: tokenizer.encode_flat(texts, None),
        len(texts),
        lambda i: tokenizer.encode_flat([texts[i]], None),
        place,
        hold_stderr,
    )


def guarded(
    call: Callable[[], T],
    count: int,
    encode_one: Callable[[int], object],
    place: Callable[[int], str],
    hold_stderr: bool = True,
) -> T:
    """``call()`` (an encode of ``count`` items); on a tokenizer failure, the items are encoded one at a
    time by ``encode_one`` to find the first that fails, and an :class:`InputError` names ``place`` of it."""
    held_stderr = _native_stderr_held() if hold_stderr else contextlib.nullcontext([True])
    with held_stderr as held:
        try:
            result = call()
        except BaseException as error:
            if not is_tokenizer_failure(error):
                held[0] = True
                raise
            index, failure = None, error
            for i in range(count):
                try:
                    encode_one(i)
                except BaseException as again:  # noqa: BLE001 - the same failure, located
                    if not is_tokenizer_failure(again):
                        raise
                    index, failure = i, again
                    break
            at = place(index) if index is not None else place(0) + " (or a later text of its batch)"
            raise InputError(f"{at}: the tokenizer failed on this text ({_summary(failure)})") from None
        held[0] = True
    return result
