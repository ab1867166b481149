"""Offline preparation: JSONL/HF sources, json2bin, SFT rendering, chat templates, the sample corpus, inspect."""
