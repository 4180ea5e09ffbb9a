"""The `turnkeeper` command's parts; `turnkeeper.cli` is its entry point."""
