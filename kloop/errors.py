"""The one root of every error kloop shows a user: `KloopError`.

A leaf module with no imports, so both sides (agent/ and the harness side of evaluator/) can
derive from it without importing each other. The `kloop` command catches it once and prints
one line (what, where, what to do), exit status 2; `--debug` shows the traceback instead.
"""


class KloopError(Exception):
    """Base of every error kloop raises on purpose; its message is written for the user."""
