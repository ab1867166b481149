"""llm-mix's option strings: Megatron's --data-path spelling, counts with suffixes."""

from __future__ import annotations

import pytest

from llmtools.cli import mix_args as A
from llmtools.data import mix_config as M
from llmtools.errors import InputError, UsageError


def test_parse_data_path():
    assert A.parse_data_path(["0.7", "A", "0.3", "B"]) == M.Blend(["A", "B"], [0.7, 0.3])
    assert A.parse_data_path(["0.7 A 0.3 B"]) == M.Blend(["A", "B"], [0.7, 0.3])
    assert A.parse_data_path(["A", "B"]) == M.Blend(["A", "B"], None)
    assert A.parse_data_path(["A", "B", "C"]) == M.Blend(["A", "B", "C"], None)
    assert A.parse_data_path(["30", "A", "70", "B"]).weights == [30.0, 70.0]
    with pytest.raises(UsageError, match="not a number"):
        A.parse_data_path(["0.7", "A", "B", "C"])
    with pytest.raises(InputError, match="negative"):
        A.parse_data_path(["-1", "A", "1", "B"])


def test_parse_counts():
    assert A.parse_count("2048", "--x") == 2048
    assert A.parse_count("10K", "--x") == 10_000
    assert A.parse_count("1.5B", "--x") == 1_500_000_000
    assert A.parse_count("0", "--x", allow_zero=True) == 0
    for bad in ("0", "-5", "1.5", "abc", "", "1e5"):
        with pytest.raises(UsageError):
            A.parse_count(bad, "--x")
