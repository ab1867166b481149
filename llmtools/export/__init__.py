"""Tokenized data or a mix -> a Hugging Face dataset folder (Arrow or Parquet) with its card."""
