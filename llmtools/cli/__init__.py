"""The command-line layer: one module per command, each a thin typer adapter over the library."""
