"""The optimizers are a table: each row's builder exists, and the config accepts exactly the table's names."""

from __future__ import annotations

import typing

import pytest

from llmtools.train.optimizers import OPTIMIZERS


def test_every_row_builds_from_the_torch_module():
    pytest.importorskip("torch")
    from llmtools.train import optim

    for name, kind in OPTIMIZERS.items():
        assert callable(getattr(optim, kind.build)), name


def test_the_config_takes_the_table_names_in_order():
    from llmtools.train.config_sections import OptimizerSection

    assert typing.get_args(typing.get_type_hints(OptimizerSection)["name"]) == tuple(OPTIMIZERS)
