"""Readers and writers of llmtools' files. Pure numpy/stdlib: nothing here imports torch."""
