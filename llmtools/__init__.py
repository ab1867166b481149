"""llmtools: small composable tools for LLM pretraining (data → mix → train → checkpoint → logs)."""

__version__ = "0.1.0"
