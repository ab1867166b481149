"""Benchmark decontamination: n-gram overlap between training documents and evaluation sets, decided as
lm-eval's ``Janitor`` decides it (its normalisation, its n-grams, its cutting of contaminated spans).

* :mod:`.ngrams`: the normalisation and the n-gram hashes of both sides;
* :mod:`.sources`: the evaluation texts (task files, plain JSONL, text files);
* :mod:`.index`: the index file of evaluation n-grams (built once, memory-mapped, checked on open);
* :mod:`.match`: one document against the index: its hits, the spans lm-eval would cut;
* :mod:`.step`: the curation step (drop or cut) and its per-task counts.
"""
