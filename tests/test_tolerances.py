"""No tolerance in tests/ lacks its reason: every comparison within a tolerance (``approx``, ``allclose``,
``assert_close``, ``isclose``, ``assert_allclose``, or ``<``/``<=`` against a small number) either derives
its bound from :mod:`tests.numerics` (whose docstrings are the reasons) or carries a comment on its
statement or the line above saying what numerics allow it (dtype, reductions, bitwise promise)."""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

TESTS = Path(__file__).resolve().parent
CALLS = {"approx", "allclose", "assert_close", "isclose", "assert_allclose"}
KEYWORDS = {"atol", "rtol", "abs_tol", "rel_tol", "tol", "tolerance"}
# Statements that hold other statements: each inner one is checked on its own.
BLOCKS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.If, ast.For, ast.While, ast.With, ast.Try)


def _commented_lines(source: str) -> set[int]:
    return {
        token.start[0]
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.COMMENT
    }


def _numerics_names(tree: ast.Module) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "tests.numerics":
            names.update(alias.asname or alias.name for alias in node.names)
        elif isinstance(node, ast.Import) and any(a.name == "tests.numerics" for a in node.names):
            names.add("tests")
    return names


def _small_number(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, float) and 0 < abs(node.value) < 1


def _is_tolerance(node: ast.AST) -> bool:
    if isinstance(node, ast.Call):
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        return name in CALLS or any(k.arg in KEYWORDS and _small_number(k.value) for k in node.keywords)
    if isinstance(node, ast.Assign):  # a bound kept in a variable: TOL = 1e-5
        named = any("tol" in t.id.lower() for t in node.targets if isinstance(t, ast.Name))
        return named and _small_number(node.value)
    if isinstance(node, ast.Compare):
        return any(isinstance(op, (ast.Lt, ast.LtE)) for op in node.ops) and any(
            _small_number(c) for c in node.comparators
        )
    return False


def unexplained(path: Path, root: Path = TESTS.parent) -> list[str]:
    """``path:line`` of each tolerance statement with neither a comment nor a tests.numerics name."""
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source)
    comments, derived = _commented_lines(source), _numerics_names(tree)
    found = []
    for statement in ast.walk(tree):
        if not isinstance(statement, ast.stmt) or isinstance(statement, BLOCKS):
            continue
        if not any(_is_tolerance(node) for node in ast.walk(statement)):
            continue
        lines = set(range(statement.lineno - 1, statement.end_lineno + 1))
        names = {n.id for n in ast.walk(statement) if isinstance(n, ast.Name)}
        if not (lines & comments or names & derived):
            found.append(f"{path.relative_to(root)}:{statement.lineno}")
    return found


def test_every_tolerance_has_its_reason():
    found = [hit for path in sorted(TESTS.rglob("*.py")) for hit in unexplained(path)]
    assert not found, "tolerances without a reason (derive from tests/numerics.py or comment why):\n" + (
        "\n".join(found)
    )


def test_the_scan_sees_a_bare_tolerance(tmp_path):
    bare = tmp_path / "bare.py"
    bare.write_text("def f(a, b):\n    assert abs(a - b) < 1e-5\n    assert a == approx(b)\n")
    assert unexplained(bare, tmp_path) == ["bare.py:2", "bare.py:3"]
    bare.write_text("def f(a, b):\n    # fp32 sum of 4 terms in two orders\n    assert abs(a - b) < 1e-5\n")
    assert unexplained(bare, tmp_path) == []
    bare.write_text("TOL = 1e-5\ndef f(a, b):\n    check(a, b, atol=1e-6)\n")
    assert unexplained(bare, tmp_path) == ["bare.py:1", "bare.py:3"]
    bare.write_text("from tests.numerics import sum_rel\ndef f(a, b):\n    assert abs(a - b) < sum_rel(4)\n")
    assert unexplained(bare, tmp_path) == []
