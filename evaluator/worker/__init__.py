"""Code that runs inside worker processes: the candidate process (hostile) and the reference
worker (trusted code, but the same machinery). Nothing here may import `evaluator.harness`:
what a worker computes is evidence for the harness, never a verdict (tests/evaluator/
test_boundary.py)."""
