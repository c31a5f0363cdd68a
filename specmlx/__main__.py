"""`python -m specmlx` runs the CLI."""

from specmlx.cli import main

main()
