"""Document quality rules (Gopher quality and repetition, C4, FineWeb) deciding as datatrove's filters do,
each a `Step`; recipes that order them; their parameter table."""

from llmtools.prep.curate.quality.recipes import (
    RECIPES,
    RULES,
    build_steps,
    help_text,
    markdown,
    parameter_table,
)

__all__ = ["RECIPES", "RULES", "build_steps", "help_text", "markdown", "parameter_table"]
