"""The dah tools' command lines: one module per tool over the shared options (``cli.options``)."""
