"""`python -m kloop ...` is `kloop ...`."""

from kloop.agent.cli import main

main()
