from cmasd.tools.bench.cli import cli_main

cli_main()
