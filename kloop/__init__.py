"""`python -m kloop` runs the `kloop` command line; the code lives in agent/, evaluator/, problems/."""
