"""`python -m dyngen.cli`: the `dyngen` command."""

from dyngen.cli import main

main()
