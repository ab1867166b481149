"""Curation of raw JSONL corpora before tokenization: quality filters, language identification, PII
scrubbing, benchmark decontamination and deduplication. JSONL in, JSONL out, with a record of what was
removed and why."""
