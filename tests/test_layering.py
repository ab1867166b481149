"""The package layering of ``llmtools/`` (DESIGN.md, "Package layout"), checked on every import.

Every ``import`` and ``from ... import`` in every module is read with :mod:`ast`, including the ones
inside functions (the lazy imports that keep ``--help`` fast are still dependencies). An import is an
arrow from the importing file's package to the imported package (``llmtools.ckpt.convert`` ->
``ckpt``; the modules at the root, ``errors``, ``fsutil``, ``_native``, are packages of their own) or
to a third-party library. A failure names the file, the line and the forbidden arrow.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "llmtools"

HEAVY = {"torch", "deepspeed", "transformers"}
# Packages that never depend on training: training is built on them, not the other way round.
BELOW_TRAIN = {"ckpt", "model", "formats", "data", "prep", "tokenize", "logs"}
# What the file formats may use of ours: the errors they raise, atomic file writing, writing through a
# checked folder handle (dirfd: never through a planted link) and the compiled helpers (the index check
# on open; _native imports nothing of ours); the package root holds nothing but the version string.
FORMATS_MAY_USE = {"formats", "errors", "fsutil", "dirfd", "_native", "llmtools"}


@dataclass(frozen=True)
class Arrow:
    file: str  # relative to the repository
    line: int
    source: str  # the importing package
    target: str  # a package of ours, or a top-level third-party module
    ours: bool
    imported: str  # the module as written

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.source} -> {self.target} (import {self.imported})"


def _package_of(path: Path) -> str:
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return parts[0] if len(parts) > 1 else parts[0] if parts[0] != "__init__" else "llmtools"


def _module_name(path: Path) -> list[str]:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return parts[:-1] if parts[-1] == "__init__" else parts


def _our_target(dotted: str) -> str:
    parts = dotted.split(".")
    return parts[1] if len(parts) > 1 else "llmtools"


def _is_ours_below_root(name: str) -> bool:
    return (PACKAGE / f"{name}.py").is_file() or (PACKAGE / name / "__init__.py").is_file()


def arrows() -> list[Arrow]:
    found: list[Arrow] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        source = _package_of(path)
        module = _module_name(path)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), rel)):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:  # relative: resolved against this module's package
                    base = module[: len(module) - node.level + (path.name == "__init__.py")]
                    base_name = ".".join(base + ([node.module] if node.module else []))
                else:
                    base_name = node.module or ""
                names = [base_name]
                if base_name == "llmtools":  # from llmtools import _native: the submodule is the target
                    names = [
                        f"llmtools.{a.name}" if _is_ours_below_root(a.name) else "llmtools"
                        for a in node.names
                    ]
            else:
                continue
            for name in names:
                if name == "llmtools" or name.startswith("llmtools."):
                    target = _our_target(name)
                    if target != source:
                        found.append(Arrow(rel, node.lineno, source, target, True, name))
                else:
                    found.append(Arrow(rel, node.lineno, source, name.split(".")[0], False, name))
    return found


def _report(bad: list[tuple[Arrow, str]]) -> str:
    return "forbidden imports:\n" + "\n".join(f"  {arrow}: {why}" for arrow, why in bad)


def forbidden(all_arrows: list[Arrow]) -> list[tuple[Arrow, str]]:
    bad = []
    for a in all_arrows:
        if a.source == "formats" and not a.ours and a.target in HEAVY:
            bad.append((a, "formats never imports torch, deepspeed or transformers"))
        if a.source != "cli" and (a.target == "typer" or (a.ours and a.target == "cli")):
            bad.append(
                (a, "nothing outside cli/ imports cli or typer (the library knows nothing of the CLI)")
            )
        if a.source in BELOW_TRAIN and a.ours and a.target == "train":
            bad.append((a, f"{a.source} never imports train (training is built on it)"))
        if a.source == "formats" and a.ours and a.target not in FORMATS_MAY_USE:
            bad.append((a, "formats imports nothing of ours but errors, fsutil, dirfd and _native"))
    return bad


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one node (the cycles)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return out


def cycles(all_arrows: list[Arrow]) -> list[str]:
    graph: dict[str, set[str]] = defaultdict(set)
    where: dict[tuple[str, str], list[Arrow]] = defaultdict(list)
    for a in all_arrows:
        if a.ours:
            graph[a.source].add(a.target)
            where[(a.source, a.target)].append(a)
    messages = []
    for component in strongly_connected(graph):
        members = set(component)
        lines = [
            f"  {arrows_[0]}" for (s, t), arrows_ in sorted(where.items()) if s in members and t in members
        ]
        messages.append(f"packages {', '.join(component)} import each other:\n" + "\n".join(lines))
    return messages


def test_the_walk_sees_imports_inside_functions():
    """A control: the walk must see a lazy import (here, plan -> tasks inside a function body or not)."""
    found = arrows()
    assert any(a.file.endswith("train/loop.py") and a.target == "torch" for a in found)
    assert any(a.source == "cli" and a.target == "train" for a in found)


def test_no_forbidden_arrow():
    bad = forbidden(arrows())
    assert not bad, _report(bad)


def test_no_cycle_between_packages():
    found = cycles(arrows())
    assert not found, "\n".join(found)


def test_the_rules_catch_what_they_are_meant_to():
    """The checks themselves fail on the arrows the design forbids (so a passing run means something)."""

    def arrow(source, target, ours=True):
        return Arrow(
            f"llmtools/{source}/x.py", 7, source, target, ours, f"llmtools.{target}" if ours else target
        )

    bad = forbidden(
        [
            arrow("formats", "torch", ours=False),
            arrow("data", "cli"),
            arrow("model", "typer", ours=False),
            arrow("ckpt", "train"),
            arrow("formats", "data"),
            arrow("train", "ckpt"),  # allowed
            arrow("formats", "errors"),  # allowed
        ]
    )
    assert [(a.source, a.target) for a, _ in bad] == [
        ("formats", "torch"),
        ("data", "cli"),
        ("model", "typer"),
        ("ckpt", "train"),
        ("formats", "data"),
    ]
    assert "llmtools/ckpt/x.py:7: ckpt -> train" in _report(bad)
    found = cycles([arrow("ckpt", "model"), arrow("model", "ckpt"), arrow("train", "ckpt")])
    assert len(found) == 1 and "packages ckpt, model import each other" in found[0]


# What training reads never imports offline preparation: the file layouts they share live in formats/.
NEVER_IMPORT_PREP = {"data", "train"}


def prep_arrows(all_arrows: list[Arrow]) -> list[Arrow]:
    return [a for a in all_arrows if a.source in NEVER_IMPORT_PREP and a.ours and a.target == "prep"]


def test_data_and_train_never_import_prep():
    found = prep_arrows(arrows())
    assert not found, "data/ and train/ import prep/ (file layouts belong in formats/):\n" + "\n".join(
        f"  {a}" for a in found
    )
    control = [Arrow("llmtools/data/x.py", 3, "data", "prep", True, "llmtools.prep.sft")]
    assert prep_arrows(control) == control


# The client-state entries only the trainer's own parts save (llmtools/train/state.py); the checkpoint
# manager saves and restores the parts without knowing them (the header entries every checkpoint carries,
# progress and identity, are ckpt's own: llmtools/ckpt/state.py).
TRAINER_KEYS = ("task_state", "health_state", "trackers", "data_ledger")


def _string_constants(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    return {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    }


def test_ckpt_never_names_a_trainer_key():
    assert set(TRAINER_KEYS) <= _string_constants(PACKAGE / "train" / "state.py")  # a control: they are its
    named = [
        f"{path.relative_to(ROOT)}: {key!r}"
        for path in sorted((PACKAGE / "ckpt").rglob("*.py"))
        for key in sorted(set(TRAINER_KEYS) & _string_constants(path))
    ]
    assert not named, "ckpt/ names an entry of the trainer's checkpointed parts:\n  " + "\n  ".join(named)
