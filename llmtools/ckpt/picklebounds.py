"""Bounds on a pickle, checked by reading its opcodes before anything is unpickled.

A pickle of a few hundred bytes can describe an object graph that costs gigabytes and minutes to build or
to walk: a memo index of four billion makes C's unpickler allocate a memo table that large; a list put in
the memo and appended to the next list twice, level after level, doubles with every level (a DAG whose
tree has 2**n nodes: whoever walks the result — printing, converting, comparing — walks all of them); a
list appended to itself never ends for a walker that does not check. :func:`check` reads the opcodes with
``pickletools`` (pure Python, nothing runs, a signal stops it between any two opcodes), simulates the
unpickler's stack with one node per object, and refuses the pickle when

* it has more than :data:`MAX_OPS` opcodes, a memo index other than the next free one, a reference to a
  memo entry never made, or an integer wider than :data:`MAX_INT_BYTES`;
* the object it builds, as a tree (every memo reference expanded), has more than :data:`MAX_NODES`
  nodes, nests deeper than :data:`MAX_DEPTH`, or contains itself.

* a container holds more than :data:`MAX_ITEMS` items;
* anything is hashed (a dict key, a set element, the items given to ``set``, ``frozenset`` or a dict
  type called with arguments) that is not a string or an integer below :data:`MAX_KEY_INT` in magnitude
  — the keys our writers produce. Other keys can be made to hash alike (integers that are multiples of
  2**61-1, floats, tuples of them): each insertion then compares with every key before it, and building
  the dict takes time quadratic in its size inside one C call that holds the GIL, where no signal handler
  (nor :mod:`llmtools.interrupt`'s watchdog) can run. Strings hash with a per-process random seed.

What is left for the unpickler is work linear in the pickle's size. The limits are far above what
checkpoints hold (DeepSpeed's optimizer states of a 70B model: a few hundred thousand nodes, depth < 10).
The check itself is pure Python: a signal stops it between any two opcodes. A pickle of
:data:`PROGRESS_BYTES` or more (seconds of work at the limits: the check of two million opcodes takes
about ten, their unpickling a few) reports both phases on stderr (:class:`llmtools.progress.Progress`),
``check`` then ``unpickle``: the unpickling reads through :func:`reading`.
"""

from __future__ import annotations

import contextlib
import io
import pickletools
from collections.abc import Iterator
from typing import Any

from llmtools.errors import InputError

MAX_OPS = 2_000_000  # a million tensors' worth: DeepSpeed's largest pickles are far smaller
MAX_NODES = 10_000_000
MAX_DEPTH = 100
MAX_INT_BYTES = 64  # integers in checkpoints are sizes, steps, seeds: 512 bits is far beyond them
MAX_ITEMS = 1 << 22  # per container: a state dict holds one entry per parameter, a few thousand
MAX_KEY_INT = 1 << 31  # integer keys are parameter indices; hash(n) == n below 2**61-1
PROGRESS_BYTES = 1 << 20  # checkpoints' pickles are smaller (a state dict: a few hundred bytes a tensor)
_PROGRESS_OPS = 1 << 16  # opcodes between two progress updates of the check

_TEXT = {
    "UNICODE", "BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8", "STRING", "BINSTRING", "SHORT_BINSTRING",
    "BINBYTES", "SHORT_BINBYTES", "BINBYTES8",
}  # fmt: skip
_INTEGER = {"INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4"}
_SEQUENCE = {"EMPTY_LIST": "list", "LIST": "list", "EMPTY_TUPLE": "tuple", "TUPLE": "tuple",
             "TUPLE1": "tuple", "TUPLE2": "tuple", "TUPLE3": "tuple"}  # fmt: skip
# Callables that hash what they are given: sets from an iterable; dict types only ever with no arguments
# (a dict is pickled as the type called with () and then SETITEMS).
_HASH_ITERABLE = {"builtins set", "builtins frozenset", "__builtin__ set", "__builtin__ frozenset"}
_DICT_TYPES = {"builtins dict", "__builtin__ dict", "collections OrderedDict", "collections Counter",
               "collections defaultdict"}  # fmt: skip

_GET = {"GET", "BINGET", "LONG_BINGET"}
_PUT = {"PUT", "BINPUT", "LONG_BINPUT"}
# Opcodes that add to the container below them and leave that container on the stack.
_INTO = {"APPEND", "APPENDS", "SETITEM", "SETITEMS", "ADDITEMS", "BUILD"}


class PickleBombError(InputError):
    def __init__(self, where: str, what: str) -> None:
        super().__init__(f"{where}: refusing to unpickle: {what} (a pickle bomb, or not a checkpoint)")

    def __reduce__(self):  # raised in a worker process: arrives in the parent as the same message
        return InputError, (str(self),)


class _Node:
    __slots__ = ("children", "kind", "value")

    def __init__(self, children: list[_Node] | None = None, kind: str = "", value: Any = None) -> None:
        self.children = children if children is not None else []
        self.kind = kind  # "str", "int", "global", "list", "tuple" or "" (anything else)
        self.value = value  # the string, the integer, or "module name" of a global


def check(data: bytes, where: str) -> None:
    """:class:`PickleBombError` (exit 2) naming ``where`` when ``data`` breaks a bound above."""
    stack: list[_Node] = []
    marks: list[int] = []
    memo: list[_Node] = []
    root: _Node | None = None
    try:
        with _progress(data, f"check {where}") as bar:
            root = _simulate(data, where, stack, marks, memo, bar)
    except PickleBombError:
        raise
    except (ValueError, IndexError) as error:  # genops on a malformed pickle, or a stack underflow
        raise InputError(f"{where}: not a valid pickle ({error})") from None
    if root is not None:
        _check_tree(root, where)


def _progress(data: bytes, desc: str):
    from llmtools.progress import Progress

    return Progress(len(data), desc, unit="B", enabled=len(data) >= PROGRESS_BYTES)


def _simulate(
    data: bytes, where: str, stack: list[_Node], marks: list[int], memo: list[_Node], bar
) -> _Node | None:
    """The unpickler's stack, one node per object; the top object at STOP (None without one)."""
    for count, (op, arg, pos) in enumerate(pickletools.genops(data), 1):
        if count > MAX_OPS:
            raise PickleBombError(where, f"more than {MAX_OPS} opcodes")
        if not count % _PROGRESS_OPS:
            bar.update(pos - bar.n)
        name = op.name
        if name == "MARK":
            marks.append(len(stack))
        elif name in _PUT or name == "MEMOIZE":
            index = len(memo) if name == "MEMOIZE" else arg
            if index != len(memo) or not stack:
                raise PickleBombError(
                    where, f"memo index {index} at byte {pos} (the next free is {len(memo)})"
                )
            memo.append(stack[-1])
        elif name in _GET:
            if not isinstance(arg, int) or not 0 <= arg < len(memo):
                raise PickleBombError(where, f"a reference to memo entry {arg} never made, at byte {pos}")
            stack.append(memo[arg])
        elif name == "STOP":
            return stack[-1] if stack else None
        else:
            if name in ("LONG1", "LONG4") and isinstance(arg, int) and arg.bit_length() > 8 * MAX_INT_BYTES:
                raise PickleBombError(where, f"an integer wider than {MAX_INT_BYTES} bytes at byte {pos}")
            _apply(op, arg, stack, marks, (where, pos))
    return None


def _apply(op, arg, stack: list[_Node], marks: list[int], at: tuple[str, int]) -> None:
    before, after = op.stack_before, op.stack_after
    popped: list[_Node] = []
    if pickletools.markobject in before:
        if not marks:
            raise ValueError("an opcode without its MARK")
        mark = marks.pop()
        popped = stack[mark:]
        del stack[mark:]
        below = before.index(pickletools.markobject)
        if below:
            if len(stack) < below:
                raise ValueError("stack underflow")
            popped = stack[-below:] + popped
            del stack[-below:]
    elif before:
        if len(stack) < len(before):
            raise ValueError("stack underflow")
        popped = stack[-len(before) :]
        del stack[-len(before) :]
    name = op.name
    if len(popped) > MAX_ITEMS:
        raise _bomb(at, f"a container of more than {MAX_ITEMS} items")
    if name in ("SETITEM", "SETITEMS"):
        _hashable(popped[1::2], at)
    elif name == "DICT":
        _hashable(popped[0::2], at)
    elif name in ("ADDITEMS", "FROZENSET"):
        _hashable(popped[1:] if name == "ADDITEMS" else popped, at)
    elif name in ("REDUCE", "OBJ", "INST"):
        if name == "INST":
            called, args = f"{arg}", popped
        else:
            called = popped[0].value if popped and popped[0].kind == "global" else None
            args = popped[1].children if name == "REDUCE" and popped[1].kind == "tuple" else popped[1:]
        if called in _DICT_TYPES and args:
            raise _bomb(at, f"{called.replace(' ', '.')} called with arguments (a dict is pickled as items)")
        if called in _HASH_ITERABLE and args:
            if len(args) != 1 or args[0].kind not in ("list", "tuple"):
                raise _bomb(at, f"{called.replace(' ', '.')} of something other than a list")
            _hashable(args[0].children, at)
    if name in _INTO:
        container = popped[0]
        container.children.extend(popped[1:])
        if len(container.children) > MAX_ITEMS:
            raise _bomb(at, f"a container of more than {MAX_ITEMS} items")
        stack.append(container)
    elif name == "DUP":
        stack.extend(popped * 2)
    elif after:
        node = _Node(popped, *_kind(name, arg, popped))
        stack.extend([node] * len(after))


def _bomb(at: tuple[str, int], what: str) -> PickleBombError:
    return PickleBombError(at[0], f"{what} at byte {at[1]}")


def _kind(name: str, arg: Any, popped: list[_Node]) -> tuple[str, Any]:
    if name in _TEXT:
        return "str", arg
    if name in _INTEGER or name in ("NEWTRUE", "NEWFALSE"):
        return "int", int(name == "NEWTRUE" if arg is None else arg)
    if name == "GLOBAL":
        return "global", arg
    if name == "STACK_GLOBAL":
        if all(node.kind == "str" and isinstance(node.value, str) for node in popped):
            return "global", " ".join(node.value for node in popped)
        return "global", None
    return _SEQUENCE.get(name, ""), None


def _hashable(keys: list[_Node], at: tuple[str, int]) -> None:
    """Only what our writers hash: strings and small integers (nothing that can be made to collide)."""
    for key in keys:
        if key.kind == "str" or (key.kind == "int" and abs(key.value) < MAX_KEY_INT):
            continue
        what = f"the integer {key.value}" if key.kind == "int" else f"a {key.kind or 'non-string'} object"
        raise _bomb(
            at, f"{what} as a dict key or set element (only strings and integers below {MAX_KEY_INT})"
        )


def _check_tree(root: _Node, where: str) -> None:
    """Tree size and depth of the graph under ``root`` (each node's subtree counted once, iteratively)."""
    sizes: dict[int, int] = {}
    depths: dict[int, int] = {}
    on_path: set[int] = set()
    work: list[tuple[_Node, bool]] = [(root, False)]
    while work:
        node, done = work.pop()
        key = id(node)
        if done:
            on_path.discard(key)
            size = 1 + sum(sizes[id(c)] for c in node.children)
            depth = 1 + max((depths[id(c)] for c in node.children), default=0)
            if size > MAX_NODES:
                raise PickleBombError(
                    where, f"it builds more than {MAX_NODES} objects (memo references expanded)"
                )
            if depth > MAX_DEPTH:
                raise PickleBombError(where, f"it nests deeper than {MAX_DEPTH}")
            sizes[key], depths[key] = size, depth
            continue
        if key in sizes:
            continue
        if key in on_path:
            raise PickleBombError(where, "an object that contains itself")
        on_path.add(key)
        work.append((node, True))
        for child in node.children:
            if id(child) in on_path:
                raise PickleBombError(where, "an object that contains itself")
            if id(child) not in sizes:
                work.append((child, False))


class _Reading(io.BytesIO):
    """The pickle as the unpickler reads it, each read told to a progress bar."""

    def __init__(self, data: bytes, bar) -> None:
        super().__init__(data)
        self._bar = bar

    def read(self, size: int | None = -1) -> bytes:
        chunk = super().read(size)
        self._bar.update(len(chunk))
        return chunk

    def readline(self, size: int | None = -1) -> bytes:
        line = super().readline(size)
        self._bar.update(len(line))
        return line

    def readinto(self, buffer) -> int:
        count = super().readinto(buffer)
        self._bar.update(count)
        return count


@contextlib.contextmanager
def reading(data: bytes, where: str) -> Iterator[io.BytesIO]:
    """``data`` as a file for an unpickler; a large pickle's reads are shown as ``unpickle WHERE``
    progress (small ones, every checkpoint's, are read as they are)."""
    if len(data) < PROGRESS_BYTES:
        yield io.BytesIO(data)
        return
    with _progress(data, f"unpickle {where}") as bar:
        yield _Reading(data, bar)


def bounded_loads(data: bytes, where: str, unpickler: Any) -> Any:
    """``unpickler(BytesIO(data)).load()`` after :func:`check`."""
    check(data, where)
    with reading(data, where) as file:
        return unpickler(file).load()
