"""Duplicate removal for `llm-prep dedup`: exact and MinHash LSH near duplicates, in stages (signatures,
buckets, clusters, apply) that run on one machine or as Slurm arrays, deciding as datatrove decides."""
