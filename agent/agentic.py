"""A tool-using agent (`strategy.kind: agent`): the model calls tools until it submits.

A step is one model call, offered `TOOLS` through the API's native tool calling, and the one
tool call it makes (the first, if it makes several): evaluate(code), profile(code), problem(),
submit(code). A reply without a tool call submits the module in its ```python block, or is a
model fault (feedback, and a step). Each step is a TurnRecord (the call in `tool`, the kernel and
its verdict, the tool's result as `feedback`), recorded, charged and shown as a turn of the turn
loop is. The call is logged in calls.jsonl as the turn loop's are (`agent.episode.ask_logged`),
its reply with it, before its tool runs, so a run killed meanwhile resumes with that reply
instead of asking again. The episode's kernel is the best one it evaluated (agent.tally),
submitted or not. The tools themselves are in agent/tools.py.
"""

from __future__ import annotations

import time
from typing import Protocol

from kloop.agent.budget import Meter, Spend
from kloop.agent.episode import (
    EpisodeEnv,
    EpisodeSpec,
    EpisodeState,
    ask_logged,
    episode_record,
    keep_turn,
    sha256_text,
)
from kloop.agent.episode import opening as turn_opening
from kloop.agent.errors import InfraFault
from kloop.agent.loop import check_stop
from kloop.agent.models.base import Address, Message
from kloop.agent.records import CallRecord, EpisodeRecord, StopReason, TurnRecord, utcnow
from kloop.agent.tally import Unaccounted
from kloop.agent.tools import NOT_RUN, TOOLS, Facts, run_tool
from kloop.evaluator.common.result import ErrorInfo

__all__ = ["NOT_RUN", "TOOLS", "Facts", "run_agent_episode"]


class CallSink(Protocol):
    """Where the agent's model calls are logged and read back (the run store)."""

    def append_call(self, record: CallRecord) -> None: ...

    def calls(self) -> list[CallRecord]: ...


def pending_replies(calls: list[CallRecord], key: str, own: list[TurnRecord]) -> dict[int, CallRecord]:
    """By step, the answered calls of episode `key` that kept their reply and that no step
    recorded yet: their tool was cut off (a kill, an infrastructure fault), so the resumed
    episode runs it with this reply."""
    named = {t.call_id for t in own}
    return {c.turn: c for c in calls if c.episode_key == key and c.phase == "answered"
            and c.reply is not None and c.call_id not in named}


def opening(spec: EpisodeSpec, env: EpisodeEnv) -> list[Message]:
    """The turn loop's task message, after a system prompt that explains the tools."""
    variables = {"problem": spec.problem, "backend": env.agent.backend, "gpu": env.agent.gpu,
                 "max_turns": spec.max_turns, "comparison": env.comparison}
    return [Message(role="system", content=env.prompts.render("agent_system", **variables)),
            turn_opening(spec, env)[1]]


def conversation(first: list[Message], steps: list[TurnRecord]) -> list[Message]:
    """What the model is sent: the opening, then each step's reply and the results of its calls."""
    out = list(first)
    for t in steps:
        out.append(Message(role="assistant", content=t.reply.text, tool_calls=t.reply.tool_calls))
        for c in t.reply.tool_calls:
            ran = t.tool is not None and c.id == t.tool.id
            out.append(Message(role="tool", tool_call_id=c.id, content=t.feedback if ran else NOT_RUN))
        if not t.reply.tool_calls:
            out.append(Message(role="user", content=t.feedback))
    return out


def _submitted(rec: TurnRecord) -> bool:
    return rec.fault is None and rec.tool is not None and rec.tool.name == "submit"


def _infra(what: str, e: InfraFault) -> tuple[tuple[StopReason, str], ErrorInfo]:
    return ("infra_error", f"{what} failed: {e}"), ErrorInfo(type=type(e).__name__, message=str(e))


def run_agent_episode(spec: EpisodeSpec, env: EpisodeEnv, done: list[TurnRecord] | None = None,
                      carried: Unaccounted | None = None, *, facts: Facts) -> EpisodeRecord:
    """Run (or, given the steps already `done`, continue) one agent episode to its stop reason.
    `carried`: calls of this episode paid for but not yet accounted for (as `run_episode`)."""
    state = EpisodeState(spec, done)
    unrecorded, unrecorded_calls = (carried.spend, list(carried.call_ids)) if carried else (Spend(), [])
    meter = Meter(env.limits, "episode", parent=env.run_meter, spent=state.spend + unrecorded)
    sink: CallSink = env.sink  # type: ignore[assignment]
    pending = pending_replies(sink.calls(), spec.key, state.own)
    first = opening(spec, env)
    started_at = done[0].started_at if done else utcnow()
    error: ErrorInfo | None = None
    while True:
        turn = len(state.own) + 1
        if state.own and _submitted(state.own[-1]):
            stop = ("submitted", f"submitted at step {state.own[-1].turn}")
            break
        # A call recorded before a kill was made and paid: it is used whatever the limits say now.
        if turn not in pending and (stop := check_stop(spec, env, state, meter)) is not None:
            break
        turn_start, clock = utcnow(), time.monotonic()
        messages = conversation(first, state.own)
        if turn in pending:
            reply, call_id = pending[turn].reply, pending[turn].call_id
            assert reply is not None
            if call_id in unrecorded_calls:  # the meter holds it already; the step accounts for it now
                unrecorded_calls.remove(call_id)
                unrecorded = unrecorded - Spend.of_reply(reply)
            else:
                meter.charge(Spend.of_reply(reply))
        else:
            try:
                reply, call_id = ask_logged(env, spec, messages, Address(
                    problem=spec.problem.id, episode=spec.episode, turn=turn), tools=TOOLS)
            except InfraFault as e:
                stop, error = _infra("model call", e)
                break
            meter.charge(Spend.of_reply(reply))
        try:
            out = run_tool(reply, spec, env, state, facts)
        except InfraFault as e:
            # Paid, and in calls.jsonl with its reply: a resumed run uses it and records the step.
            unrecorded += Spend.of_reply(reply)
            unrecorded_calls.append(call_id)
            stop, error = _infra("evaluation", e)
            break
        gpu_s = out.result.held_s if out.result is not None else 0.0  # judged in this step
        meter.charge(Spend(eval_s=out.eval_s, gpu_s=gpu_s))
        code = out.code
        rec = TurnRecord(
            run_id=env.run_id, episode_key=spec.key, episode=spec.episode,
            problem_id=spec.problem.id, problem_stem=spec.problem.stem, turn=turn,
            position=state.position, parent=state.parent, messages=messages, reply=reply,
            fault=out.fault, call_id=call_id, code=code,
            code_sha256=sha256_text(code) if code is not None else None,
            kernel_path=env.sink.kernel_relpath(spec.problem.stem, spec.episode, turn) if code else None,
            eval=out.result, feedback=out.text, tool=out.call,
            spend=Spend.of_reply(reply).model_copy(
                update={"eval_s": out.eval_s, "gpu_s": gpu_s, "wall_s": time.monotonic() - clock}),
            started_at=turn_start, finished_at=utcnow())
        keep_turn(env, state, rec, meter)
    return episode_record(env, spec, state, stop, unrecorded, unrecorded_calls, error,
                          started_at)
