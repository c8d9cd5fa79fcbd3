"""CLI subcommands: one module each (see tensorscope.cli)."""
