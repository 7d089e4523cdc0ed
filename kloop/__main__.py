"""`python -m kloop ...` is `kloop ...`."""

from agent.cli import main

main()
