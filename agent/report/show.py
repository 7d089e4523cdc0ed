"""`kloop show`: one trajectory in the terminal, turn by turn: the prompt the model got, its
reply, the kernel, the evaluator's verdict and the feedback the next turn starts from; with
`--tree`, each problem's search tree (which turn continues which), node by node."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from kloop.agent.records import EpisodeRecord, TurnRecord
from kloop.agent.report.metrics import turn_status
from kloop.agent.store import RunStore
from kloop.agent.tree import Tree, draw
from kloop.evaluator.common.result import EvalResult

CLIP_CHARS = 2500
CLIP_LINES = 120


def _clip(text: str, full: bool, chars: int = CLIP_CHARS) -> str:
    if full or len(text) <= chars:
        return text
    return text[:chars] + f"\n… ({len(text) - chars} more characters; --full shows all)"


def _clip_lines(code: str, full: bool) -> str:
    lines = code.splitlines()
    if full or len(lines) <= CLIP_LINES:
        return code
    return "\n".join(lines[:CLIP_LINES]) + f"\n# … ({len(lines) - CLIP_LINES} more lines; --full shows all)"


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.4g} ms"


def verdict_table(ev: EvalResult) -> Table:
    """The evaluator's verdict on one kernel as a two-column table."""
    t = Table(show_header=False, box=None, pad_edge=False)
    t.add_column(style="bold")
    t.add_column()
    t.add_row("status", f"{ev.status} (stage reached: {ev.stage_reached})")
    t.add_row("policy / device", f"{ev.policy} / {ev.device}")
    if ev.timing is not None:
        t.add_row("runtime", f"{_ms(ev.timing.median_ms)} median ({ev.timing.clock} clock, {ev.timing.n_trials} trials)")
    if ev.eager is not None or ev.compiled is not None or ev.compiled_ro is not None:
        t.add_row("baselines", f"eager {_ms(ev.eager.median_ms if ev.eager else None)}, "
                               f"torch.compile {_ms(ev.compiled.median_ms if ev.compiled else None)}, "
                               f"reduce-overhead {_ms(ev.compiled_ro.median_ms if ev.compiled_ro else None)}")
    if ev.speedup_vs_eager is not None or ev.speedup_vs_compile is not None:
        def fmt(v: float | None, baseline: str | None) -> str:
            ci = ev.speedup_ci.get(baseline) if baseline else None
            return "-" if v is None else f"{v:.3g}x" + (f" [{ci.low:.3g}, {ci.high:.3g}]" if ci else "")
        best = (f"; {fmt(ev.speedup_vs_best, ev.best_baseline)} vs the fastest ({ev.best_baseline})"
                if ev.best_baseline else "")
        level = next((round(100 * ci.level, 1) for ci in ev.speedup_ci.values()), None)
        rounds = (f" (intervals: {level:g} %, over {ev.paired.rounds} paired rounds)"
                  if ev.paired is not None and level is not None else "")
        t.add_row("speedup", f"{fmt(ev.speedup_vs_eager, 'eager')} vs eager, "
                             f"{fmt(ev.speedup_vs_compile, 'compile')} vs compile, "
                             f"{fmt(ev.speedup_vs_compile_ro, 'compile_ro')} vs compile_ro{best}{rounds}")
    if ev.profile is not None:
        share = ev.profile.custom_share
        t.add_row("custom kernels", "none in the profile" if share is None else f"{share:.0%} of device time")
    if ev.flags:
        t.add_row("flags", ", ".join(ev.flags))
    for v in ev.violations:
        t.add_row(f"{v.severity}: {v.rule}", v.message + (f" (line {v.line})" if v.line else ""))
    if ev.compile is not None and ev.compile.diagnostics:
        diags = [f"{d.file or ''}:{d.line or '?'}: {d.message}" + (f" (x{d.count})" if d.count > 1 else "")
                 for d in ev.compile.diagnostics[:5]]
        t.add_row("compiler", "\n".join(diags))
    failed = [tr for tr in ev.correctness if not tr.passed]
    if failed:
        worst = max((o.max_abs_err or 0.0 for tr in failed for o in tr.outputs), default=0.0)
        t.add_row("correctness", f"{len(failed)}/{len(ev.correctness)} trials failed; max abs err {worst:.3g}")
    if ev.error is not None:
        t.add_row("error", f"{ev.error.type}: {ev.error.message}")
    return t


def trajectory_note(t: TurnRecord) -> str:
    """Where a turn of an episode that continues another trajectory (a fork, a beam or tree
    child) sits in what the model saw, whose prompts count the inherited turns too."""
    if t.position is None or t.position == t.turn:
        return ""
    return f" (turn {t.position} of the trajectory the model saw; {t.position - t.turn} inherited)"


def render_turn(t: TurnRecord, full: bool = False, prompt: bool = True) -> list[RenderableType]:
    """Renderables for one turn, in reading order."""
    out: list[RenderableType] = []
    if prompt:
        if t.messages:
            shown = t.messages if full else t.messages[-1:]
            for i, m in enumerate(shown, start=len(t.messages) - len(shown) + 1):
                title = f"prompt message {i}/{len(t.messages)} ({m.role})" + ("" if full else "; --full shows all")
                out.append(Panel(Text(_clip(m.content, full)), title=title, title_align="left"))
        else:
            out.append(Text("prompt: not recorded (imported kernel)", style="dim"))
    if t.summary is not None:
        sc = t.summary
        note = f"; unusable ({sc.fault.message}), the digest stood in" if sc.fault else ""
        out.append(Panel(Text(_clip(sc.text, full)), title_align="left",
                         title=f"summary call before this turn: turns 1-{sc.covers}{note}"))
    if t.reply.reasoning:
        out.append(Panel(Text(_clip(t.reply.reasoning, full), style="dim"), title="reasoning", title_align="left"))
    u = t.reply.usage
    tokens = "usage unknown" if u is None else f"{u.input_tokens} in / {u.output_tokens} out tokens"
    title = f"reply: {tokens}, finish {t.reply.finish_reason}, {t.reply.retries} retries"
    reply_text = t.reply.text
    if t.code is not None and "```" in reply_text:
        reply_text = reply_text.split("```")[0].rstrip() + "\n[kernel below]"
    out.append(Panel(Text(_clip(reply_text, full) or "(no reply text recorded)"), title=title, title_align="left"))
    if t.tool is not None:
        out.append(Text(tool_line(t), style="bold"))
    if t.fault is not None:
        out.append(Text(f"model fault: {t.fault.type}: {t.fault.message}", style="yellow"))
    if t.code is not None:
        out.append(Panel(Syntax(_clip_lines(t.code, full), "python", line_numbers=True),
                         title=f"kernel {t.kernel_path or ''}", title_align="left"))
    if t.eval is not None:
        out.append(Panel(verdict_table(t.eval), title=f"verdict: {t.eval.status}", title_align="left"))
    else:
        out.append(Text(f"verdict: {turn_status(t)}", style="bold"))
    if t.feedback:
        what = "tool result (the next step's input)" if t.reply.tool_calls else "feedback (the next turn's prompt)"
        out.append(Panel(Text(_clip(t.feedback, full)), title=what, title_align="left"))
    s = t.spend
    out.append(Text(f"spend: {s.calls} call(s), {s.total_tokens} tokens, ${s.cost_usd:.4f}, "
                    f"eval {s.eval_s:.1f} s (device held {s.gpu_s:.1f} s), turn {s.wall_s:.1f} s",
                    style="dim"))
    return out


def tool_line(t: TurnRecord) -> str:
    """The tool call a step ran, its code argument shown as the kernel panel (or its size)."""
    assert t.tool is not None
    called = f"tool call: {t.tool.name}(" + ("code" if t.tool.name != "problem" else "") + ")"
    others = len(t.reply.tool_calls) - 1
    if t.tool.id == "":
        called += " (no call: the reply's code block, submitted)"
    elif t.code is None and t.tool.name != "problem" and t.fault is None:
        called += " (a module judged at an earlier step: its verdict is reused)"
    return called + (f"; {others} more call(s) not run" if others > 0 else "")


def _matches(t: TurnRecord, problem: str) -> bool:
    key = problem.strip().lower()
    return key in (t.problem_id.lower(), t.problem_stem.lower())


def index_table(turns: list[TurnRecord], episodes: list[EpisodeRecord]) -> Table:
    """Problems and episodes of a run, to pick one from."""
    table = Table(title="episodes (pick one with --problem ID [--episode N]; --tree draws the search tree)")
    for col in ("problem", "episode", "turns", "verdicts", "stop"):
        table.add_column(col)
    stops = {(e.problem_id, e.episode): e.stop_reason for e in episodes}
    groups: dict[tuple[str, int], list[TurnRecord]] = {}
    for t in turns:
        groups.setdefault((t.problem_id, t.episode), []).append(t)
    for (pid, ep), ts in sorted(groups.items()):
        verdicts = Counter(turn_status(t) for t in ts)
        table.add_row(pid, str(ep), str(len(ts)), ", ".join(f"{k} {v}" for k, v in verdicts.items()),
                      stops.get((pid, ep), "unfinished"))
    return table


def tree_text(turns: list[TurnRecord], episodes: list[EpisodeRecord], problem_id: str,
              source: list[TurnRecord] | None = None) -> list[str]:
    """One problem's search tree as lines of text (every turn a node under the one it continues);
    `source`: the turns of the run this one was forked from, whose nodes its roots continue."""
    mine = [t for t in turns if t.problem_id == problem_id]
    tree = Tree(mine, {e.episode_key: e.parent for e in episodes if e.problem_id == problem_id},
                external={(t.episode_key, t.turn): f"{t.episode}:{t.turn}" for t in source or []})
    stem = mine[0].problem_stem if mine else ""
    return draw(tree.rows(), f"{problem_id} {stem}: {len(tree.nodes)} nodes (EPISODE:TURN, as --fork-at takes)")


def show(run_dir: Path, console: Console, problem: str | None = None, episode: int | None = None,
         turn: int | None = None, full: bool = False, tree: bool = False) -> int:
    """Print the selected turns (all episodes of `problem` unless `episode` is given); returns how
    many were shown. Without a problem, prints the run's index of episodes. `tree`: print the
    search tree of `problem` (of every problem without one) instead; returns its node count."""
    store = RunStore.open(run_dir)
    turns, episodes = store.turns(), store.episodes()
    if tree:
        ids = list(dict.fromkeys(t.problem_id for t in turns if problem is None or _matches(t, problem)))
        record = store.config_record()
        source = None
        if record.kind == "fork" and record.source_run and (Path(record.source_run) / "config.json").is_file():
            source = RunStore.open(Path(record.source_run)).turns()
        for pid in ids:
            console.print(Text("\n".join(tree_text(turns, episodes, pid, source))))
        return sum(1 for t in turns if t.problem_id in ids)
    if problem is None:
        console.print(index_table(turns, episodes))
        return 0
    stops = {(e.problem_id.lower(), e.episode): e for e in episodes}
    chosen = sorted((t for t in turns if _matches(t, problem) and (episode is None or t.episode == episode)
                     and (turn is None or t.turn == turn)), key=lambda t: (t.episode, t.turn))
    current = None
    for t in chosen:
        if t.episode != current:
            current = t.episode
            ep = stops.get((t.problem_id.lower(), t.episode))
            stop = f"stopped: {ep.stop_reason} ({ep.stop_detail})" if ep else "not finished"
            console.rule(f"[bold]{t.problem_id} {t.problem_stem} episode {t.episode}[/bold]: {stop}")
        console.rule(f"turn {t.turn}{trajectory_note(t)}: {turn_status(t)}", style="dim")
        console.print(Group(*render_turn(t, full)))
    return len(chosen)
