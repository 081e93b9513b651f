"""``python -m cmasd.tools.prep SUBCOMMAND ...``: the same as ``cmasd-prep``."""

from cmasd.tools.prep.cli import cli_main

cli_main()
