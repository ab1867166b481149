"""Each config field declares its resume rule beside itself: a field without one fails where it is defined."""

from __future__ import annotations

import pytest

from llmtools.train.resume import POLICY
from llmtools.train.resume_rules import FROM_NEXT_STEP, config_section, ruled


def test_a_field_without_a_rule_fails_at_class_creation():
    with pytest.raises(TypeError, match=r"NewSection\.every: no resume rule"):

        @config_section
        class NewSection:
            every: int = 0


def test_a_field_with_a_rule_reaches_the_policy():
    @config_section
    class NewSection:
        every: int = ruled(FROM_NEXT_STEP, 0)

    assert NewSection().every == 0
    assert POLICY["eval.every"] is FROM_NEXT_STEP
