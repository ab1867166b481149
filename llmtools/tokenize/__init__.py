"""Tokenizer loading (all kinds, offline), fast batched encoding, and BPE training.

Heavy libraries (tokenizers, gigatoken, sentencepiece, transformers) load inside the functions.
"""

from llmtools.tokenize.base import SPECIAL_POLICIES, Tokenizer
from llmtools.tokenize.loader import load_tokenizer

__all__ = ["SPECIAL_POLICIES", "Tokenizer", "load_tokenizer"]
