"""`python -m llmtools.prep.curate.quality`: print the "Quality rules" section of docs/curation.md."""

from llmtools.prep.curate.quality.recipes import markdown

print(markdown(), end="")
