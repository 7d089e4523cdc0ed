"""`KernelEnv`: the turn loop as a gymnasium environment, for RL training on kernel writing.

    env = KernelEnv(evaluator, problems, reward=RewardConfig(speedup_weight=0.5))
    messages, info = env.reset(options={"problem": "L3/1"})
    messages, reward, terminated, truncated, info = env.step(policy(messages))

The observation is the chat the policy answers next, as `[{"role", "content"}, ...]`: after
`reset` the system and task messages, after `step` the same with the reply and its feedback
appended (the feedback text is the last message's content, and `info["feedback"]`), condensed
by the `agent.context` policy exactly as the turn loop condenses it. An action is the reply text.
The prompts, the code extraction, the evaluator and the feedback are the turn loop's own
(agent/loop.py); the reward is `agent.rl.reward`. `info["eval"]` is the typed EvalResult.

A turn that ends with a correct kernel under `agent.stop_when_correct`, or the
`max_consecutive_format_errors`-th reply in a row without code, terminates the episode; the
`max_turns`-th turn truncates it. `step_many` steps several environments at once, their
candidates going through one evaluator queue (`evaluator.procs.scheduler`, or a Ray pool's workers).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, NamedTuple

from kloop.errors import KloopError

try:
    import gymnasium
    from gymnasium import spaces
except ImportError as e:  # an optional extra: say how to get it
    raise KloopError('KernelEnv needs gymnasium: pip install -e ".[rl]" in the kloop clone') from e

from kloop.agent.budget import Meter, Spend
from kloop.agent.config import AgentConfig, Limits
from kloop.agent.context import build_messages, condense
from kloop.agent.episode import (
    EpisodeEnv,
    EpisodeSpec,
    EpisodeState,
    TurnSink,
    feedback_template,
    feedback_vars,
    opening,
    sha256_text,
)
from kloop.agent.loop import extract
from kloop.agent.models.base import Address, ModelReply
from kloop.agent.prompts import PromptSet
from kloop.agent.protocols import Evaluator
from kloop.agent.records import ModelFaultInfo, TurnRecord, utcnow
from kloop.agent.rl.reward import RewardConfig, reward
from kloop.evaluator.common.config import Comparison, EvalConfig
from kloop.evaluator.common.result import EvalResult
from kloop.problems.registry import Problem


class Chat(spaces.Space):
    """A list of chat messages, each `{"role": str, "content": str}`."""

    def contains(self, x: Any) -> bool:
        return isinstance(x, list) and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in x)


class ReplyText(spaces.Space):
    """A model's reply: any text."""

    def contains(self, x: Any) -> bool:
        return isinstance(x, str)

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        """A reply without code (a random kernel would be noise): it earns `format_error`."""
        return ""


class Pending(NamedTuple):
    """A step between its reply and its verdict (so several can be judged as one batch)."""

    reply: ModelReply
    messages: list
    code: str | None
    fault: ModelFaultInfo | None
    started_at: str


class KernelEnv(gymnasium.Env):
    """One problem per episode, one reply per step; see the module docstring."""

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, evaluator: Evaluator, problems: list[Problem], *,
                 reward_config: RewardConfig | None = None, agent: AgentConfig | None = None,
                 max_turns: int = 4, comparison: Comparison | None = None,
                 prompts: PromptSet | None = None, sink: TurnSink | None = None):
        """`sink` (a RunStore): where each step's TurnRecord and kernel file are written, so an
        environment's trajectories are a run directory (`kloop show`, `kloop report`)."""
        self.agent = agent or AgentConfig()
        if self.agent.context == "summary":
            raise KloopError("KernelEnv: the summary context policy needs a model call of its "
                             "own; use full, last_k, last or digest")
        if not problems:
            raise KloopError("KernelEnv: no problems given")
        self.evaluator, self.problems, self.max_turns = evaluator, problems, max_turns
        self.reward_config = reward_config or RewardConfig()
        self.observation_space, self.action_space = Chat(), ReplyText()
        self.sink = sink
        self.run_id = getattr(sink, "run_id", "env")
        self._env = EpisodeEnv(
            run_id=self.run_id, model=None, evaluator=evaluator, agent=self.agent,  # type: ignore[arg-type]
            limits=Limits(), run_meter=Meter(Limits(), "env"), sink=sink,  # type: ignore[arg-type]
            prompts=prompts or PromptSet(self.agent.prompts_dir),
            comparison=comparison or EvalConfig().comparison())
        self._episodes = 0
        self._state: EpisodeState | None = None

    # -- gymnasium ------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Start an episode on `options["problem"]` (an id, a stem or a Problem), else on a
        problem drawn with the environment's generator."""
        super().reset(seed=seed)
        problem = self._pick((options or {}).get("problem"))
        spec = EpisodeSpec(problem=problem, key=f"env:{problem.id}:{self._episodes}",
                           episode=self._episodes, sample=0, max_turns=self.max_turns)
        self._episodes += 1
        self._state = EpisodeState(spec)
        self._opening = opening(spec, self._env)
        return self._observation(), {"problem_id": problem.id, "turn": 0}

    def step(self, action: str):
        pending = self.begin(action)
        result, seconds = None, 0.0
        if pending.code is not None:
            start = time.monotonic()
            result = self.evaluator.evaluate(self.state.spec.problem, pending.code)
            seconds = time.monotonic() - start
        return self.finish(pending, result, seconds)

    # -- the two halves of a step ---------------------------------------------------------------
    @property
    def state(self) -> EpisodeState:
        if self._state is None:
            raise KloopError("KernelEnv: call reset() before step()")
        return self._state

    def begin(self, action: str) -> Pending:
        """The reply and the kernel in it (or why there is none); nothing judged yet."""
        if not isinstance(action, str):
            raise KloopError(f"KernelEnv: an action is the reply text, not {type(action).__name__}")
        messages = self._messages()
        reply = ModelReply(text=action, usage=None, cost_usd=None, finish_reason="stop",
                           latency_s=0.0, model="policy", raw={})
        code, fault = extract(reply)
        return Pending(reply, messages, code, fault, utcnow())

    def finish(self, pending: Pending, result: EvalResult | None, eval_s: float):
        """Record the verdict as a turn; the gymnasium step tuple."""
        state, cfg = self.state, self.agent
        spec = state.spec
        feedback = self._env.prompts.render(feedback_template(result),
                                            **feedback_vars(state, result, pending.fault, cfg,
                                                          self._env.comparison.precision))
        code, turn = pending.code, len(state.own) + 1
        rec = TurnRecord(
            run_id=self.run_id, episode_key=spec.key, episode=spec.episode,
            problem_id=spec.problem.id, problem_stem=spec.problem.stem, turn=turn,
            position=state.position, parent=state.parent, messages=pending.messages, reply=pending.reply,
            fault=pending.fault, code=code,
            code_sha256=sha256_text(code) if code is not None else None,
            # where the kernel is (with a sink) or would be in a run directory
            kernel_path=f"kernels/{spec.problem.stem}/{spec.episode}-{turn}.py" if code else None,
            eval=result, feedback=feedback, spend=Spend(eval_s=eval_s),
            started_at=pending.started_at, finished_at=utcnow())
        rec.best_decision = state.decide(rec)
        if self.sink is not None:
            self.sink.append_turn(rec)
        state.add(rec)
        value = reward(result, self.reward_config)
        solved = cfg.stop_when_correct and result is not None and result.correct
        terminated = solved or state.consecutive_faults >= cfg.max_consecutive_format_errors
        truncated = not terminated and len(state.own) >= spec.max_turns
        info = {"eval": result, "fault": pending.fault, "feedback": feedback, "status": rec.status,
                "turn": rec.turn, "best": state.best}
        return self._observation(), value, terminated, truncated, info

    # -- helpers --------------------------------------------------------------------------------
    def _messages(self) -> list:
        state = self.state
        at = Address(problem=state.spec.problem.id, episode=state.spec.episode, turn=len(state.own) + 1)
        condensed = condense(state.trajectory, self._env, at, state.spec.problem.stem)
        return build_messages(self._opening, state.trajectory, self.agent, condensed)

    def _observation(self) -> list[dict[str, str]]:
        return [{"role": m.role, "content": m.content} for m in self._messages()]

    def _pick(self, wanted: str | Problem | None) -> Problem:
        if isinstance(wanted, Problem):
            return wanted
        if wanted is None:
            return self.problems[int(self.np_random.integers(len(self.problems)))]
        key = str(wanted).lower()
        for p in self.problems:
            if key in (p.id.lower(), p.stem.lower()):
                return p
        raise KloopError(f"KernelEnv: no problem {wanted!r} among "
                         f"{', '.join(p.id for p in self.problems)}")


def step_many(envs: list[KernelEnv], actions: list[str], concurrency: int = 4) -> list[tuple]:
    """Step every env with its action, judging their kernels together through the evaluator's
    one queue (`LocalEvaluator.batch`: static checks and builds run ahead of the device stages),
    or through `concurrency` threads for an evaluator without one (a Ray pool spreads those
    over its workers). Returns each env's step tuple, in order."""
    pending = [env.begin(a) for env, a in zip(envs, actions, strict=True)]
    evaluator = envs[0].evaluator
    batch = getattr(evaluator, "batch", None) or (lambda n: _threads(evaluator, n))
    with batch(concurrency) as submit:
        futures = [submit(env.state.spec.problem, p.code) if p.code is not None else None
                   for env, p in zip(envs, pending, strict=True)]
        judged = [f.result() if f is not None else (None, 0.0) for f in futures]
    return [env.finish(p, result, seconds)
            for env, p, (result, seconds) in zip(envs, pending, judged, strict=True)]


@contextlib.contextmanager
def _threads(evaluator: Evaluator, concurrency: int) -> Iterator:
    def judged(problem: Problem, code: str) -> tuple[EvalResult, float]:
        start = time.monotonic()
        return evaluator.evaluate(problem, code), time.monotonic() - start

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        def submit(problem: Problem, code: str) -> Future:
            return pool.submit(judged, problem, code)
        yield submit
