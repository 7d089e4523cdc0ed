"""Trusted: the command lines around the evaluator (kloop eval, kloop check)."""
