"""Build hook for the one compiled piece of llmtools: llm-mix's index builders and json2bin's JSONL scanner.

Everything else is in pyproject.toml. The extension is optional: without a C compiler the install
still succeeds, and llmtools compiles it on first use (or falls back to numpy/Python, with a warning).
"""

import sys

from setuptools import Extension, setup

extra = [] if sys.platform == "win32" else ["-O3", "-ffp-contract=off", "-fno-fast-math"]

setup(
    ext_modules=[
        Extension(
            "llmtools._native._helpers",
            sources=["llmtools/_native/mixhelpers.c", "llmtools/_native/jsonl.c"],
            define_macros=[("LLM_PYTHON_MODULE", "1")],
            extra_compile_args=extra,
            optional=True,
        )
    ]
)
