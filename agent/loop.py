"""The agent loop: query → extract → evaluate → render feedback → append the turn.

One function, `run_episode`, on one screen. Limits are all checked before each model call and
every episode ends with a recorded stop reason. Under the `summary` context policy a turn's query
may follow a summary call (agent/context.py), recorded and charged with the turn. Model faults
(no usable code block) become feedback and count as a turn; infrastructure faults (provider or
evaluator) end the episode with `infra_error` and are never scored as the model's failure.
"""

from __future__ import annotations

import logging
import time

from kloop.agent.budget import Meter, Spend
from kloop.agent.context import Condensed, build_messages, condense
from kloop.agent.episode import (
    EpisodeEnv,
    EpisodeSpec,
    EpisodeState,
    ask_logged,
    episode_record,
    feedback_template,
    feedback_vars,
    keep_turn,
    opening,
    sha256_text,
)
from kloop.agent.errors import InfraFault, ModelFault
from kloop.agent.extract import extract_code
from kloop.agent.models.base import Address, ModelReply
from kloop.agent.records import EpisodeRecord, ModelFaultInfo, StopReason, TurnRecord, utcnow
from kloop.agent.tally import Unaccounted
from kloop.evaluator.common.result import ErrorInfo, EvalResult

log = logging.getLogger(__name__)


def check_stop(spec: EpisodeSpec, env: EpisodeEnv, state: EpisodeState,
               meter: Meter) -> tuple[StopReason, str] | None:
    """Why the episode must stop before its next model call, or None to go on."""
    if len(state.own) >= spec.max_turns:
        return "max_turns", f"{spec.max_turns} turn(s) done"
    if env.agent.stop_when_correct and state.best is not None:
        return "solved", f"correct kernel at turn {state.best.turn}"
    if state.consecutive_faults >= env.agent.max_consecutive_format_errors:
        return "format_errors", f"{state.consecutive_faults} replies in a row without usable code"
    if (reached := meter.exceeded()) is not None:
        return "budget", reached
    return None


def evaluate_timed(env: EpisodeEnv, spec: EpisodeSpec, code: str) -> tuple[EvalResult, float]:
    """The verdict and the wall seconds of the evaluator call (GPU-seconds on a GPU host)."""
    start = time.monotonic()
    result = env.evaluator.evaluate(spec.problem, code)
    return result, time.monotonic() - start


def extract(reply: ModelReply) -> tuple[str | None, ModelFaultInfo | None]:
    """The kernel of a reply, or why there is none (a model fault: feedback, and a turn)."""
    try:
        return extract_code(reply.text, reply.finish_reason), None
    except ModelFault as e:
        return None, ModelFaultInfo(type=type(e).__name__, message=str(e))


def run_episode(spec: EpisodeSpec, env: EpisodeEnv, done: list[TurnRecord] | None = None,
                carried: Unaccounted | None = None) -> EpisodeRecord:
    """Run (or, given the turns already `done`, continue) one episode to its stop reason.
    `carried`: calls of this episode paid for but not yet accounted for (a killed process's)."""
    state = EpisodeState(spec, done)
    unrecorded, unrecorded_calls = (carried.spend, list(carried.call_ids)) if carried else (Spend(), [])
    meter = Meter(env.limits, "episode", parent=env.run_meter, spent=state.spend + unrecorded)
    opening_msgs = opening(spec, env)
    started_at = done[0].started_at if done else utcnow()
    error: ErrorInfo | None = None
    while (stop := check_stop(spec, env, state, meter)) is None:
        turn_start, clock = utcnow(), time.monotonic()
        at = Address(problem=spec.problem.id, episode=spec.episode, turn=len(state.own) + 1)
        context = Condensed()
        try:
            context = condense(state.trajectory, env, at, spec.problem.stem)
            meter.charge(context.spend)
            messages = build_messages(opening_msgs, state.trajectory, env.agent, context)
            reply, call_id = ask_logged(env, spec, messages, at)
        except InfraFault as e:
            unrecorded += context.spend
            stop, error = ("infra_error", f"model call failed: {e}"), _error_info(e)
            break
        meter.charge(Spend.of_reply(reply))
        code, fault = extract(reply)
        result, eval_s, gpu_s = None, 0.0, 0.0
        if code is not None:
            try:
                result, eval_s = evaluate_timed(env, spec, code)
            except InfraFault as e:
                unrecorded += context.spend + Spend.of_reply(reply)
                unrecorded_calls.append(call_id)
                stop, error = ("infra_error", f"evaluation failed: {e}"), _error_info(e)
                break
            gpu_s = result.held_s
            meter.charge(Spend(eval_s=eval_s, gpu_s=gpu_s))
        feedback = env.prompts.render(feedback_template(result),
                                      **feedback_vars(state, result, fault, env.agent,
                                                     env.comparison.precision))
        turn = len(state.own) + 1
        spend = (context.spend + Spend.of_reply(reply)).model_copy(
            update={"eval_s": eval_s, "gpu_s": gpu_s, "wall_s": time.monotonic() - clock})
        rec = TurnRecord(
            run_id=env.run_id, episode_key=spec.key, episode=spec.episode,
            problem_id=spec.problem.id, problem_stem=spec.problem.stem, turn=turn,
            position=state.position,
            parent=state.parent, messages=messages, reply=reply, summary=context.call, fault=fault,
            call_id=call_id, code=code,
            code_sha256=sha256_text(code) if code is not None else None,
            kernel_path=env.sink.kernel_relpath(spec.problem.stem, spec.episode, turn) if code else None,
            eval=result, feedback=feedback, spend=spend, started_at=turn_start, finished_at=utcnow())
        keep_turn(env, state, rec, meter)
        log.info("%s episode %d turn %d: %s", spec.problem.id, spec.episode, rec.turn, rec.status)
    if stop[0] == "infra_error":
        log.error("%s episode %d stopped: %s", spec.problem.id, spec.episode, stop[1])
    return episode_record(env, spec, state, stop, unrecorded, unrecorded_calls, error,
                          started_at)


def _error_info(e: Exception) -> ErrorInfo:
    return ErrorInfo(type=type(e).__name__, message=str(e))
