"""The tools of the tool-using agent (agent/agentic.py), and what running one call does.

`evaluate(code)` judges a module and answers with the feedback a turn of the turn loop gets;
`profile(code)` answers with the profiler's tables (judging the module first if this episode
has not); `problem()` with the task, the sizes it is judged at and the hardware; `submit(code)`
ends the episode. A call the agent cannot run (no such tool, arguments that are not a JSON
object, no `code`) is a model fault: the model is told why, and it counts as a step.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from kloop.agent.components import problem_configs
from kloop.agent.episode import (
    EpisodeEnv,
    EpisodeSpec,
    EpisodeState,
    feedback_template,
    feedback_vars,
    sha256_text,
)
from kloop.agent.episode import opening as turn_opening
from kloop.agent.loop import evaluate_timed, extract
from kloop.agent.models.base import ModelReply, ToolCall, ToolSpec
from kloop.agent.records import ModelFaultInfo
from kloop.evaluator.common.config import EvalConfig
from kloop.evaluator.common.result import EvalResult

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
            state, result, None, env.agent, env.comparison.precision, tool_mode=True))
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
