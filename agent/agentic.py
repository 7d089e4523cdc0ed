"""A tool-using agent (`strategy.kind: agent`): the model calls tools until it submits.

A step is one model call, offered `TOOLS` through the API's native tool calling, and the one
tool call it makes (the first, if it makes several): evaluate(code), profile(code), problem(),
submit(code). A reply without a tool call submits the module in its ```python block, or is a
model fault (feedback, and a step). Each step is a TurnRecord (the call in `tool`, the kernel and
its verdict, the tool's result as `feedback`), recorded, charged and shown as a turn of the turn
loop is. The reply is written to calls.jsonl before its tool runs, so a run killed meanwhile
resumes with that reply instead of asking again. The episode's kernel is the best one it
evaluated (agent.tally), submitted or not.
"""

from __future__ import annotations

import json
import time
from typing import Any, NamedTuple, Protocol

from agent.budget import Meter, Spend
from agent.components import problem_configs
from agent.episode import (
    EpisodeEnv,
    EpisodeSpec,
    EpisodeState,
    feedback_template,
    feedback_vars,
    sha256_text,
)
from agent.episode import opening as turn_opening
from agent.errors import InfraFault
from agent.loop import check_stop, evaluate_timed, extract
from agent.models.base import Address, Message, ModelReply, ToolCall, ToolSpec
from agent.records import CallRecord, EpisodeRecord, ModelFaultInfo, TurnRecord, utcnow
from evaluator.config import EvalConfig
from evaluator.result import ErrorInfo, EvalResult

_CODE = {"type": "object", "required": ["code"], "additionalProperties": False,
         "properties": {"code": {"type": "string", "description": "The complete Python module: "
                                 "imports, kernels and `class ModelNew`."}}}
TOOLS = [
    ToolSpec(name="evaluate", parameters=_CODE, description="Judge a module: compile it, check "
             "it against the reference on fresh random inputs, time it. Returns the verdict."),
    ToolSpec(name="profile", parameters=_CODE, description="The profiler's table of where a "
             "correct module's time goes (the module is judged first if it was not yet)."),
    ToolSpec(name="problem", parameters={"type": "object", "properties": {}},
             description="The task: the reference model, the sizes it is judged at, the hardware."),
    ToolSpec(name="submit", parameters=_CODE, description="Give the final answer and end the "
             "session. The fastest correct module evaluated is the result either way."),
]
NOT_RUN = "Not run: one tool call per reply; only the first was run."


class CallSink(Protocol):
    """Where the agent's model calls go before their tool runs (the run store)."""

    def append_call(self, record: CallRecord) -> None: ...

    def calls(self) -> list[CallRecord]: ...


class Facts(NamedTuple):
    """What `problem()` tells beyond the task: the run's evaluator config and size overrides."""

    eval: EvalConfig
    overrides: dict[str, dict[str, Any]]


class Outcome(NamedTuple):
    """What one tool call did: the kernel it judged (if any), its verdict, the text the model gets."""

    text: str
    call: ToolCall | None = None
    """The call that ran (a reply's code block submitted without a call: one with id "")."""
    code: str | None = None
    result: EvalResult | None = None
    eval_s: float = 0.0
    fault: ModelFaultInfo | None = None


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


def ask(env: EpisodeEnv, messages: list[Message], at: Address) -> ModelReply:
    query_at = getattr(env.model, "query_at", None)
    if query_at is not None:
        return query_at(messages, at, tools=TOOLS)
    return env.model.query(messages, tools=TOOLS)


def _fault(env: EpisodeEnv, message: str, kind: str = "ToolCallError") -> Outcome:
    fault = ModelFaultInfo(type=kind, message=message)
    return Outcome(text=env.prompts.render("tool_error", fault=fault), fault=fault)


def _judged(state: EpisodeState, code: str) -> tuple[int, EvalResult] | None:
    """The step of this episode that last judged `code`, and its verdict."""
    sha = sha256_text(code)
    return next(((t.turn, t.eval) for t in reversed(state.own)
                 if t.code_sha256 == sha and t.eval is not None), None)


def run_tool(reply: ModelReply, spec: EpisodeSpec, env: EpisodeEnv, state: EpisodeState,
             facts: Facts) -> Outcome:
    """Run the reply's first tool call (or submit its code block); InfraFault passes through."""
    call = reply.tool_calls[0] if reply.tool_calls else None
    if call is None:
        code, fault = extract(reply)
        if code is None:
            assert fault is not None
            return _fault(env, f"Your reply called no tool ({fault.message})", fault.type)
        call = ToolCall(id="", name="submit", arguments=json.dumps({"code": code}))
    try:
        args = json.loads(call.arguments or "{}")
    except ValueError:
        args = None
    if not isinstance(args, dict):
        return _fault(env, f"The arguments of {call.name} are not a JSON object")
    if call.name == "problem":
        return Outcome(text=problem_text(spec, env, state, facts), call=call)
    if call.name not in ("evaluate", "profile", "submit"):
        return _fault(env, f"There is no tool {call.name!r}")
    code = args.get("code")
    if not isinstance(code, str) or not code.strip():
        return _fault(env, f"{call.name} needs `code`: the complete module as a string")
    # profile and submit reuse a verdict this episode has (evaluate always judges anew): the
    # step then records no kernel, so each judgement is counted once.
    earlier = None if call.name == "evaluate" else _judged(state, code)
    if earlier is not None:
        return Outcome(text=_result_text(call, env, state, earlier[1], earlier[0]), call=call)
    result, seconds = evaluate_timed(env, spec, code)
    return Outcome(text=_result_text(call, env, state, result, None), call=call, code=code,
                   result=result, eval_s=seconds)


def _result_text(call: ToolCall, env: EpisodeEnv, state: EpisodeState, result: EvalResult,
                 judged_at: int | None) -> str:
    if call.name == "evaluate":  # what a turn of the turn loop would be told
        return env.prompts.render(feedback_template(result), **feedback_vars(
            state, result, None, env.agent, tool_mode=True))
    name = "tool_profile" if call.name == "profile" else "tool_submitted"
    return env.prompts.render(name, result=result, judged_at=judged_at, profile_feedback=True,
                              max_chars=env.agent.feedback_max_chars)


def problem_text(spec: EpisodeSpec, env: EpisodeEnv, state: EpisodeState, facts: Facts) -> str:
    config = problem_configs(facts.eval, facts.overrides, [spec.problem])[spec.problem.id]
    judged = [t.eval for t in state.own if t.eval is not None]
    device = judged[-1].device if judged else config.device
    hardware = (f"{device}; on a CPU, kernels run in the Triton interpreter and times come from "
                "a host clock (not comparable with GPU times)" if device == "cpu" else device)
    return env.prompts.render("tool_problem", task=turn_opening(spec, env)[1].content,
                              sizes=config.problem_overrides, hardware=hardware)


def _submitted(rec: TurnRecord) -> bool:
    return rec.fault is None and rec.tool is not None and rec.tool.name == "submit"


def run_agent_episode(spec: EpisodeSpec, env: EpisodeEnv, done: list[TurnRecord] | None = None,
                      *, facts: Facts) -> EpisodeRecord:
    """Run (or, given the steps already `done`, continue) one agent episode to its stop reason."""
    state = EpisodeState(spec, done)
    meter = Meter(env.limits, "episode", parent=env.run_meter, spent=state.spend)
    sink: CallSink = env.sink  # type: ignore[assignment]
    pending = {c.turn: c for c in sink.calls() if c.episode_key == spec.key}
    first = opening(spec, env)
    started_at = done[0].started_at if done else utcnow()
    error: ErrorInfo | None = None
    unrecorded = Spend()
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
            reply = pending[turn].reply
        else:
            try:
                reply = ask(env, messages, Address(problem=spec.problem.id, episode=spec.episode, turn=turn))
            except InfraFault as e:
                stop, error = ("infra_error", f"model call failed: {e}"), ErrorInfo(type=type(e).__name__, message=str(e))
                break
            sink.append_call(CallRecord(run_id=env.run_id, episode_key=spec.key, problem_id=spec.problem.id,
                                        episode=spec.episode, turn=turn, reply=reply, started_at=turn_start))
        meter.charge(Spend.of_reply(reply))
        try:
            out = run_tool(reply, spec, env, state, facts)
        except InfraFault as e:
            unrecorded = Spend.of_reply(reply)
            stop, error = ("infra_error", f"evaluation failed: {e}"), ErrorInfo(type=type(e).__name__, message=str(e))
            break
        meter.charge(Spend(eval_s=out.eval_s))
        rec = TurnRecord(
            run_id=env.run_id, episode_key=spec.key, episode=spec.episode,
            problem_id=spec.problem.id, problem_stem=spec.problem.stem, turn=turn,
            parent=state.parent, messages=messages, reply=reply, fault=out.fault, code=out.code,
            code_sha256=sha256_text(out.code) if out.code is not None else None,
            kernel_path=env.sink.kernel_relpath(spec.problem.stem, spec.episode, turn) if out.code else None,
            eval=out.result, feedback=out.text, tool=out.call,
            spend=Spend.of_reply(reply).model_copy(update={"eval_s": out.eval_s, "wall_s": time.monotonic() - clock}),
            started_at=turn_start, finished_at=utcnow())
        env.sink.append_turn(rec)
        state.add(rec)
        if env.on_turn is not None:
            env.on_turn(rec)
    reason, detail = stop
    return EpisodeRecord(
        run_id=env.run_id, episode_key=spec.key, episode=spec.episode,
        problem_id=spec.problem.id, problem_stem=spec.problem.stem,
        problem_sha256=spec.problem.sha256, sample=spec.sample, round=spec.round,
        parent=spec.parent, turns=len(state.own), statuses=[r.status for r in state.own],
        stop_reason=reason, stop_detail=detail, best=state.best,
        spend=state.spend + unrecorded, unrecorded_spend=unrecorded, error=error,
        started_at=started_at, finished_at=utcnow(),
    )
