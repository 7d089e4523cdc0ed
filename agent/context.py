"""What the model sees of the earlier turns: the context policies of `AgentConfig.context`.

`full`, `last_k` and `last` keep some turns whole and drop the rest. `digest` and `summary` keep
the latest turns whole and condense the older ones into one message after the task:

- `digest` renders it from the turn records alone (prompts/context_digest.j2): no call, the same
  text for the same records;
- `summary` asks the model to write it (prompts/summarize.j2), from the previous summary and the
  turns it did not cover. The call is charged like any other and recorded on the turn it precedes
  (`TurnRecord.summary`); the next turns, a resumed episode, a replay and a fork all find it in
  the trajectory, so the same turns are never summarised twice.

Which turns are condensed is `condensed_count`: in steps of `context_k`, so the condensed
message (and every prompt token before the latest turns) stays the same for k turns at a time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from kloop.agent.budget import Spend
from kloop.agent.config import AgentConfig
from kloop.agent.episode import EpisodeEnv, ask
from kloop.agent.models.base import Address, Message
from kloop.agent.records import ModelFaultInfo, SummaryCall, TurnRecord

CONDENSING = ("digest", "summary")
NOTE_CHARS = 160
# Finish reasons after which a summary's text cannot be trusted to be whole.
_UNUSABLE_FINISH = ("length", "refusal", "content_filter")


def condensed_count(n: int, agent: AgentConfig) -> int:
    """How many of the first of `n` earlier turns the policy condenses (0 for the others)."""
    if agent.context not in CONDENSING:
        return 0
    k = agent.context_k
    return max(0, (n - k) // k * k)


class DigestRow(NamedTuple):
    turn: int
    status: str
    runtime_ms: float | None
    speedup_vs_eager: float | None
    speedup_vs_compile: float | None
    note: str
    """The head of what went wrong (empty for a correct kernel)."""


def error_head(rec: TurnRecord) -> str:
    """One line on why a turn's kernel failed, from the typed fields; "" when it did not."""
    ev = rec.eval
    if rec.fault is not None:
        text = rec.fault.message
    elif ev is None or ev.correct:
        return ""
    elif ev.compile is not None and ev.compile.diagnostics:
        d = ev.compile.diagnostics[0]
        text = f"line {d.line}: {d.message}" if d.line is not None else d.message
    elif ev.violations:
        text = f"rule {ev.violations[0].rule}: {ev.violations[0].message}"
    elif ev.error is not None:
        text = f"{ev.error.type}: {ev.error.message}"
    elif failed := [t for t in ev.correctness if not t.passed]:
        errs = [o.max_abs_err for t in failed for o in t.outputs if o.max_abs_err is not None]
        worst = f", max abs error {max(errs):.3g}" if errs else ""
        text = f"{len(failed)} of {len(ev.correctness)} checks failed{worst}"
    else:
        return ""
    line = (text.strip().splitlines() or [""])[0]
    return line if len(line) <= NOTE_CHARS else line[: NOTE_CHARS - 1] + "…"


def digest_rows(turns: list[TurnRecord], first: int = 1) -> list[DigestRow]:
    """One row per turn, numbered from `first` (trajectory positions, inherited turns included)."""
    rows = []
    for position, rec in enumerate(turns, start=first):
        ev = rec.eval
        rows.append(DigestRow(position, rec.status, ev.runtime_ms if ev else None,
                              ev.speedup_vs_eager if ev else None,
                              ev.speedup_vs_compile if ev else None, error_head(rec)))
    return rows


@dataclass
class Condensed:
    """The message standing for the condensed turns, and the summary call made for it, if any."""

    covers: int = 0
    message: Message | None = None
    call: SummaryCall | None = None

    @property
    def spend(self) -> Spend:
        return Spend.of_reply(self.call.reply) if self.call is not None else Spend()


def latest_summary(trajectory: list[TurnRecord], covers: int) -> SummaryCall | None:
    """The latest recorded summary of at most `covers` turns (a fork with a larger `context_k`
    than its source's may find summaries of more turns than it condenses: those do not fit)."""
    return next((t.summary for t in reversed(trajectory)
                 if t.summary is not None and t.summary.covers <= covers), None)


def condense(trajectory: list[TurnRecord], env: EpisodeEnv, at: Address,
             problem_stem: str) -> Condensed:
    """The condensed message for the next query; under `summary`, calls the model when the
    turns to condense have moved on since the latest recorded summary (an `InfraFault` from
    that call propagates: it ends the episode like a failed query)."""
    covers = condensed_count(len(trajectory), env.agent)
    if covers == 0:
        return Condensed()
    if env.agent.context == "digest":
        return Condensed(covers, _message(env, "context_digest", rows=digest_rows(trajectory[:covers])))
    previous = latest_summary(trajectory, covers)
    if previous is not None and previous.covers == covers:
        return Condensed(covers, _message(env, "context_summary", summary=previous.text, covers=covers))
    call = summarize(trajectory, covers, previous, env, at, problem_stem)
    return Condensed(covers, _message(env, "context_summary", summary=call.text, covers=covers), call)


def summarize(trajectory: list[TurnRecord], covers: int, previous: SummaryCall | None,
              env: EpisodeEnv, at: Address, problem_stem: str) -> SummaryCall:
    """One summary call over turns `previous.covers + 1 .. covers`, with the previous summary."""
    start = previous.covers if previous is not None else 0
    prompt = env.prompts.render(
        "summarize", problem_stem=problem_stem, backend=env.agent.backend,
        previous=previous.text if previous is not None else None, covers=covers,
        turns=[{"turn": i, "status": t.status, "reply": t.reply.text, "feedback": t.feedback}
               for i, t in enumerate(trajectory[start:covers], start=start + 1)],
        max_chars=env.agent.feedback_max_chars)
    messages = [Message(role="user", content=prompt)]
    reply = ask(env.model, messages, at.model_copy(update={"call": "summary"}))
    fault = None
    if not reply.text.strip() or reply.finish_reason in _UNUSABLE_FINISH:
        # A model fault: the digest of the same turns stands in, so the episode goes on and
        # replay shows the model exactly what it was shown.
        why = "an empty reply" if not reply.text.strip() else f"finish_reason={reply.finish_reason}"
        fault = ModelFaultInfo(type="UnusableSummary", message=f"the summary call gave {why}")
    text = reply.text.strip() if fault is None else env.prompts.render(
        "context_digest", rows=digest_rows(trajectory[:covers])).strip()
    return SummaryCall(covers=covers, messages=messages, reply=reply, text=text, fault=fault)


def build_messages(opening_msgs: list[Message], trajectory: list[TurnRecord], agent: AgentConfig,
                   condensed: Condensed | None = None) -> list[Message]:
    """Opening messages, the condensed message if any, then (reply, feedback) pairs of the turns
    the context policy keeps whole."""
    if agent.context == "full":
        kept = trajectory
    elif agent.context in CONDENSING:
        kept = trajectory[condensed_count(len(trajectory), agent):]
    else:
        kept = trajectory[-(agent.context_k if agent.context == "last_k" else 1):]
    messages = list(opening_msgs)
    if condensed is not None and condensed.message is not None:
        messages.append(condensed.message)
    for rec in kept:
        # An empty assistant message is refused by some APIs; the model still sees it said nothing.
        messages.append(Message(role="assistant", content=rec.reply.text or "(empty reply)"))
        messages.append(Message(role="user", content=rec.feedback))
    return messages


def _message(env: EpisodeEnv, template: str, **variables: object) -> Message:
    return Message(role="user", content=env.prompts.render(template, **variables))
