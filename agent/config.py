"""Run configuration: one pydantic model per component, every field documented.

A run is configured by layers merged recursively, later ones winning: the defaults below, then
each `-c` argument in order (a YAML file, or a `dotted.key=value` override whose value is parsed
as YAML), then command-line flags. The resolved config is saved in `runs/<id>/config.json` and a
run can be started again from it (`-c runs/<id>/config.json`).
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from kloop.agent.models.base import ModelConfig
from kloop.errors import KloopError
from kloop.evaluator.common.config import EvalConfig, without_removed

ContextPolicy = Literal["full", "last_k", "last", "digest", "summary"]
StrategyKind = Literal["sequential", "best_of_n", "grid", "beam", "tree", "agent"]


class ConfigError(KloopError, ValueError):
    """A config file, override or flag that cannot be used; the message says which and why."""


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


class AgentConfig(_Config):
    """How one episode talks to the model."""

    backend: Literal["cuda", "triton"] = "triton"
    """Which kernel language the prompt asks for."""
    context: ContextPolicy = "full"
    """Which earlier turns the model sees: `full` all of them, `last_k` the last `context_k`,
    `last` only the last one. `digest` and `summary` show the latest turns in full and condense
    the older ones into one message after the task: `digest` a table rendered from the records
    (status, error head, runtime and speedups per turn; no call), `summary` the text of a model
    call (prompts/summarize.j2) that is charged to the budget and recorded on the turn it
    precedes (`TurnRecord.summary`); replay and fork reuse the recorded summary. Which turns
    are condensed: see `context_k`."""
    context_k: int = Field(2, ge=1)
    """`last_k`: the number of earlier turns kept. `digest`/`summary`: the fewest turns shown in
    full. Turns are condensed in steps of k: with n earlier turns, the first
    k*floor((n-k)/k) are condensed (none while n < 2k) and the rest, k to 2k-1 of them, shown in
    full. The condensed part, and the prompt before the latest turns, so changes only every k
    turns: a summary costs one call per k turns and provider prompt caches stay warm."""
    max_consecutive_format_errors: int = Field(3, ge=1)
    """Stop the episode after this many replies in a row without a usable code block."""
    stop_when_correct: bool = False
    """Stop an episode at its first correct kernel (stop reason `solved`) instead of optimising."""
    gpu: str | None = "h200"
    """GPU facts included in the task prompt (template `_gpu_<gpu>.j2`); None leaves them out."""
    profile_feedback: bool = True
    """Include the profiler summary in the feedback on a correct kernel."""
    feedback_max_chars: int = Field(3000, ge=200)
    """Upper bound on each free-text part of the feedback (logs, tracebacks)."""
    prompts_dir: Path | None = None
    """A folder of templates that replace the packaged ones of the same name."""

    @field_validator("prompts_dir")
    @classmethod
    def _a_folder(cls, v: Path | None) -> Path | None:
        # Checked when the config is resolved, so a wrong folder fails before a run dir exists.
        if v is not None:
            from kloop.agent.prompts import check_prompts_dir

            check_prompts_dir(v)
        return v


class StrategyConfig(_Config):
    """How many episodes, of how many turns, and how they build on each other.

    `sequential` is 1×T refinement, `best_of_n` N×1 independent samples, `grid` N×T, and `beam`
    keeps the `beam_width` best kernels after each round and expands each `expand` times by
    `turns` more turns. `tree` keeps every turn of a problem as a node of one search tree: it
    starts `roots` episodes from scratch, then `expansions` more, each continuing the node with
    the highest score, value + exploration * sqrt(ln n(parent) / n(node)) (n: the nodes in a
    subtree, itself included; value: see `agent.tree.node_value`), among nodes with a kernel
    and fewer than `max_children` children. `agent` runs `samples` episodes of a tool-using
    agent (agent/agentic.py): each of its `turns` steps is one model call and the one tool call
    it makes (evaluate, profile, problem, submit). Left unset, the kind follows from `samples`
    and `turns`.
    """

    kind: StrategyKind | None = None
    """sequential, best_of_n, grid, beam, tree or agent (None: inferred from samples and turns)."""
    turns: int | None = Field(None, ge=1)
    """Turns per episode (T); for beam, turns per round; for tree, turns per expansion; for
    agent, steps (model calls) per episode."""
    samples: int | None = Field(None, ge=1)
    """Independent episodes per problem (N)."""
    beam_width: int = Field(2, ge=1)
    """Beam search: kernels kept after each round (k)."""
    expand: int = Field(2, ge=1)
    """Beam search: children started from each kept kernel per round (m)."""
    rounds: int = Field(3, ge=1)
    """Beam search: number of rounds (the first round samples k×m episodes from scratch)."""
    roots: int = Field(2, ge=1)
    """Tree search: episodes started from scratch before the first expansion."""
    expansions: int = Field(6, ge=0)
    """Tree search: episodes started after the roots, each from the node the score picks. A
    tree makes (roots + expansions) × turns calls, as many as a 1×that sequential run."""
    exploration: float = Field(0.5, ge=0)
    """Tree search: c, the weight of the exploration bonus (0: always the best node; values lie
    in [0, 1): a failed kernel scores below 0.35, a correct one 0.5 + speedup/(1 + speedup)/2)."""
    max_children: int = Field(3, ge=1)
    """Tree search: children a node may have (keeps the search from piling onto one node)."""
    batch: int = Field(1, ge=1)
    """Tree search: nodes picked per step and expanded at once (up to `concurrency`); each pick
    counts as a visit for the next, so one step's picks spread over the tree."""

    @model_validator(mode="after")
    def _resolve(self) -> StrategyConfig:
        t, n = self.turns, self.samples
        kind = self.kind
        if kind is None:
            kind = "grid" if (n or 1) > 1 and (t or 1) > 1 else "best_of_n" if (n or 1) > 1 else "sequential"
        if kind == "sequential" and (n or 1) != 1:
            raise ValueError("strategy sequential runs one episode per problem; use grid for samples > 1")
        if kind == "best_of_n" and (t or 1) != 1:
            raise ValueError("strategy best_of_n runs one turn per episode; use grid for turns > 1")
        if kind == "beam" and (n or 1) != 1:
            raise ValueError("strategy beam starts beam_width x expand episodes; samples must be 1")
        if kind == "tree" and (n or 1) != 1:
            raise ValueError("strategy tree starts roots + expansions episodes; samples must be 1")
        defaults = {"sequential": (4, 1), "best_of_n": (1, 4), "grid": (4, 4), "beam": (1, 1),
                    "tree": (1, 1), "agent": (8, 1)}
        dt, dn = defaults[kind]
        self.kind, self.turns, self.samples = kind, t or dt, n or dn
        return self


class Limits(_Config):
    """Upper bounds in matched units; None means no limit. Checked before every model call."""

    calls: int | None = Field(None, ge=0)
    """LLM calls."""
    input_tokens: int | None = Field(None, ge=0)
    """Prompt tokens (cached ones included)."""
    output_tokens: int | None = Field(None, ge=0)
    """Completion tokens (reasoning tokens included, as providers bill them)."""
    reasoning_tokens: int | None = Field(None, ge=0)
    """Reasoning tokens alone."""
    total_tokens: int | None = Field(None, ge=0)
    """Input plus output tokens."""
    cost_usd: float | None = Field(None, ge=0)
    """Dollars at the price table's list prices. A reply of unknown cost stops the episode."""
    eval_s: float | None = Field(None, ge=0)
    """Wall seconds of the evaluator calls (with builds and waits for the device: more where
    more evaluations run at once)."""
    gpu_s: float | None = Field(None, ge=0)
    """Seconds the evaluations held the device (`EvalResult.held_s`, a shared reference hold
    counted whole): GPU-seconds."""
    wall_s: float | None = Field(None, ge=0)
    """Wall-clock seconds."""


class BudgetConfig(_Config):
    """Limits for each episode and for the whole run, over one meter."""

    episode: Limits = Limits()
    """Limits of one episode (beam: of one child's turns)."""
    run: Limits = Limits()
    """Limits of the run; episodes not yet started are skipped once one is reached."""


_RAY_ADDRESS = re.compile(r"auto|(ray://)?[A-Za-z0-9_.\-]+:\d{1,5}")


class ExecutorConfig(_Config):
    """Where evaluations run. `local`: in this process, on this host's devices. `ray`: on the
    workers of a Ray cluster, one per GPU on every node; the LLM calls and the run directory stay
    with this process (the driver). Neither choice changes an episode's key or a verdict."""

    kind: Literal["local", "ray"] = "local"
    """local (default) or ray (`pip install -e ".[ray]"` in a kloop clone)."""
    address: str | None = None
    """Ray only: the cluster to join, `auto` (the one this machine is part of), `HOST:PORT` or
    `ray://HOST:PORT`; None starts a Ray instance on this machine alone."""
    resource: str = "GPU"
    """Ray only: the node resource each evaluation worker holds one unit of. `GPU` gives one worker
    per GPU; another name (a custom resource) stands in for GPUs on CPU-only clusters."""
    worker_concurrency: int = Field(4, ge=1)
    """Ray only: evaluations in flight per worker, as `concurrency` is on one host: builds and
    process starts overlap while one candidate holds the worker's GPU (timings never overlap)."""
    max_attempts: int = Field(3, ge=1)
    """Ray only: tries per candidate whose worker or node is lost mid-evaluation (an
    infrastructure fault, never the model's; the candidate goes to another worker)."""
    drain_after: int = Field(2, ge=1)
    """Ray only: evaluations lost on one node after which it gets no more work (drained)."""

    @field_validator("address")
    @classmethod
    def _an_address(cls, v: str | None) -> str | None:
        if v is not None and not _RAY_ADDRESS.fullmatch(v):
            raise ValueError(f"{v!r} is not a Ray address: give auto, HOST:PORT or ray://HOST:PORT")
        return v

    @model_validator(mode="after")
    def _ray_fields(self) -> ExecutorConfig:
        if self.kind == "local" and self.address is not None:
            raise ValueError("address is for the ray executor: add --executor ray "
                             "(executor.kind: ray)")
        return self


def judged_constants(base: dict[str, Any], overrides: dict[str, dict[str, Any]],
                     problem_id: str, problem_stem: str) -> dict[str, Any]:
    """The module constants a problem is judged with: the evaluator's own overrides, then the
    run's for that problem (keyed by id or stem, any case). The evaluator's config and the task
    prompt both read them here, so the prompt shows the sizes that are judged."""
    keys = (problem_id.lower(), problem_stem.lower())
    extra = next((v for k, v in overrides.items() if k.lower() in keys), {})
    return {**base, **extra}


class RunConfig(_Config):
    """Everything a run needs; saved resolved in `runs/<id>/config.json`."""

    problems: list[str] = Field(default_factory=list)
    """Problem ids (`L3/4`, `4_LeNet5`); empty with `level` set means the whole level."""
    level: int | None = None
    """Run every problem of this level."""
    problems_dir: Path | None = None
    """A KernelBench-format problem folder instead of the bundled Level 3 set."""
    problem_overrides: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """Module constants to override per problem id for evaluation, e.g. {"L3/1": {"batch_size": 8}}."""
    model: ModelConfig
    """The LLM (`spec` like `openai:gpt-5`, `anthropic:...`, `scripted:file.yaml`, `replay:runs/<id>`)."""
    agent: AgentConfig = AgentConfig()
    strategy: StrategyConfig = StrategyConfig()
    budget: BudgetConfig = BudgetConfig()
    eval: EvalConfig = Field(default_factory=EvalConfig)
    """How candidates are judged: device, policy, precision, timeouts (see `evaluator.EvalConfig`)."""
    seed: int = 0
    """Part of every episode key: the same config with another seed is a new set of episodes
    (resume never mixes them). kloop draws nothing from it: providers sample on their own and the
    evaluator draws fresh inputs per evaluation (`eval.salt` fixes those)."""
    concurrency: int = Field(4, ge=1)
    """Episodes run in parallel threads (LLM calls are I/O bound; the evaluator serialises GPU work)."""
    executor: ExecutorConfig = ExecutorConfig()
    """Where candidates are judged: this host (`local`) or a Ray cluster (`ray`)."""
    runs_dir: Path = Path("runs")
    """Where run directories are created."""
    run_id: str | None = None
    """Name of the run directory (default: UTC time and config digest)."""

    @model_validator(mode="after")
    def _agent_context(self) -> RunConfig:
        if self.strategy.kind == "agent" and self.agent.context != "full":
            raise ValueError("strategy agent keeps its whole tool conversation: agent.context "
                             "must be full")
        if self.strategy.kind == "agent" and self.model.thinking_budget_tokens is not None:
            # Anthropic wants each turn's thinking blocks back with its tool results; the
            # recorded conversation does not carry them.
            raise ValueError("strategy agent does not take extended thinking: unset "
                             "model.thinking_budget_tokens")
        return self

    def digest(self) -> str:
        """sha256 of the fields that decide what an episode does (not where it is stored).

        The evaluator's policy is included resolved (tolerances, trial counts), so a policy
        whose rules change under the same name gives new episode keys.
        """
        data = self.model_dump(mode="json", exclude={**{k: True for k in _OPERATIONAL},
                                                      "eval": _EVAL_OPERATIONAL})
        for name, default in _EVAL_ADDED.items():  # older runs' keys stay valid at the default
            if data["eval"].get(name) == default:
                data["eval"].pop(name)
        for name, default in _STRATEGY_ADDED.items():
            if data["strategy"].get(name) == default:
                data["strategy"].pop(name)
        data["eval"].update(_EVAL_REMOVED)
        data["eval_policy"] = self.eval.resolved_policy().model_dump(mode="json")
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


# Evaluator fields added after episode keys were first written: digested only when set to
# something other than the default, which is the behaviour from before they existed.
_EVAL_ADDED = {"l2_flush": "worker", "disk_limit_gb": 16.0, "ncu_kernels": 3}
# Evaluator fields removed after episode keys were written with them: digested at the value every
# run since has (the one behaviour left), so those keys stay valid.
_EVAL_REMOVED = {"jit_prime": "off"}
_STRATEGY_ADDED = {"roots": 2, "expansions": 6, "exploration": 0.5, "max_children": 3, "batch": 1}
# Fields that say where and how fast a run goes, or which problems it covers (each episode key
# already holds its problem's hash): changing them must not change episode keys.
_OPERATIONAL = {"problems", "level", "problems_dir", "concurrency", "runs_dir", "run_id",
                "executor"}
# The evaluator's machine-local knobs: where caches and work dirs live, what is kept for debugging.
_EVAL_OPERATIONAL = {"cache_dir", "work_root", "keep_workdir", "output_tail_bytes",
                     "hidden_from_builds", "build_slots", "child_writable"}


def saved_config(config: Any) -> Any:
    """A run config as a saved record holds it (`config.json`), less the evaluator settings
    removed since it was written (`evaluator.common.config.REMOVED`)."""
    if isinstance(config, dict) and isinstance(config.get("eval"), dict):
        return {**config, "eval": without_removed(config["eval"])}
    return config


def merge(base: dict[str, Any], layer: dict[str, Any]) -> dict[str, Any]:
    """Recursive dict merge: `layer` wins; nested dicts merge instead of being replaced."""
    out = dict(base)
    for key, value in layer.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def parse_layer(spec: str) -> dict[str, Any]:
    """One `-c` argument: a YAML/JSON file, or `a.b.c=value` (value parsed as YAML)."""
    path = Path(spec)
    if path.is_file():
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"{path}: not valid YAML: {e}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: a config file must hold a mapping, not {type(data).__name__}")
        # A saved run config (`runs/<id>/config.json`) holds the config under "config"; started
        # again, it makes a new run, so its run id is dropped.
        if "config" in data and "schema_version" in data:
            return {k: v for k, v in saved_config(data["config"]).items() if k != "run_id"}
        return data
    if "=" not in spec:
        raise ConfigError(f"-c {spec!r}: no such file, and not a key=value override")
    key, _, raw = spec.partition("=")
    return dotted(key.strip(), yaml.safe_load(raw) if raw.strip() else None)


def dotted(key: str, value: Any) -> dict[str, Any]:
    """A config layer setting one dotted key: `dotted("a.b", 1) == {"a": {"b": 1}}`."""
    *parents, leaf = key.split(".")
    layer: dict[str, Any] = {leaf: value}
    for part in reversed(parents):
        layer = {part: layer}
    return layer


def resolve(layers: list[dict[str, Any]]) -> RunConfig:
    """Merge layers in order and validate; errors name the offending key."""
    data: dict[str, Any] = {}
    for layer in layers:
        data = merge(data, layer)
    if isinstance(data.get("model"), str):
        data["model"] = {"spec": data["model"]}
    try:
        return RunConfig.model_validate(data)
    except ValidationError as e:
        # One line per field, without pydantic's URLs: "eval.device: device must be ...".
        lines = [f"{'.'.join(map(str, err['loc'])) or '<root>'}: "
                 f"{err['msg'].removeprefix('Value error, ')}" for err in e.errors()]
        raise ConfigError("invalid run config: " + "; ".join(lines)) from None


def load_config(specs: list[str], flags: dict[str, Any] | None = None) -> RunConfig:
    """Resolve `-c` arguments (files or overrides) and then CLI flags into a RunConfig."""
    return resolve([parse_layer(s) for s in specs] + [flags or {}])
