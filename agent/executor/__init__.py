"""Executors: where the evaluator runs. `local` is kloop's evaluator in this process
(`agent.components.LocalEvaluator`); `ray` sends each candidate to a worker on a Ray cluster
(`agent.executor.ray_pool`), and that worker runs the very same evaluator. Both implement the
loop's `Evaluator` protocol, so strategies, replay, import and sweeps do not know which one runs.
"""
