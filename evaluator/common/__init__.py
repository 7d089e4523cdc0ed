"""No side: the records, wire formats and pure functions both the harness and the workers use. Imports nothing of kloop outside this package."""
