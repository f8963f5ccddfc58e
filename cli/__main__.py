"""`python -m cli`: the `readout` command line without its console script."""

from cli.main import main

main()
