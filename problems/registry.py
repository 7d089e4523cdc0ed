"""The problem registry: typed `Problem` records, lookup by id, loading of problem modules.

A problem is one KernelBench-format Python file: module-level constants, `class Model`,
`get_inputs()` and `get_init_inputs()`. The bundled set is Level 3; any KernelBench-format
directory (a checkout's `KernelBench/` folder with `level1`..`level4`, one `levelN` folder, or
a flat folder of files) loads through the same code.
"""

from __future__ import annotations

import ast
import difflib
import hashlib
import importlib.util
import io
import itertools
import json
import re
import tokenize
from functools import cached_property
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

BUNDLED_DIR = Path(__file__).resolve().parent
REQUIRED_NAMES = ("Model", "get_inputs", "get_init_inputs")
_STEM_RE = re.compile(r"^(\d+)_(.+)$")
_LEVEL_DIR_RE = re.compile(r"^level(\d+)$")
_module_counter = itertools.count()


class ProblemError(ValueError):
    """A problem id that does not resolve, or a problem file that is not usable."""


def _tol(x: float) -> str:
    """1e-04 -> '1e-4': tolerances are read by people in reports and tables."""
    mantissa, exp = f"{x:.0e}".split("e")
    return f"{mantissa}e{int(exp)}"


class PrefixSensitivity(BaseModel):
    """How much of a sequence problem's input moves its output beyond a tolerance
    (scripts/probe_prefix.py, CPU fp32): a recurrence that forgets its start can be computed
    from its last steps alone."""

    model_config = ConfigDict(extra="forbid")

    tol: float
    steps: int
    """The sequence length measured (the full size's)."""
    steps_that_matter: int
    """With KernelBench's inputs, the output stays within `tol` when every step before the last
    `steps_that_matter` is replaced by another draw's."""
    window: Literal["last", "ends"]
    """Which steps matter: the last `steps_that_matter`, or that many split between both ends
    (bidirectional)."""
    truncated_steps: int | None
    """Steps a run of the model on the end of the sequence alone (the rest dropped, the given
    initial states kept) needs to pass at `tol`: the attack (None: the parameters are shaped by
    the sequence length)."""
    first_half_moves: float
    """max |a-b| / (1+|b|) between the output and the output with the first half of the
    sequence replaced by another draw's (compare with `tol`)."""
    sizes: dict[str, int]
    """Module constants overridden for the measurement (empty: full size)."""
    strict_input_scale: float | None = None
    strict_input_shift: float | None = None
    """Under a policy with `whole_input_trials`, every floating input x of every call becomes
    `strict_input_scale * x + strict_input_shift`: the input distribution under which the whole
    sequence matters."""
    strict_steps_that_matter: int | None = None
    """Steps that matter at `tol` under that distribution."""
    strict_first_half_moves: float | None = None
    """`first_half_moves` under that distribution."""

    @property
    def insensitive(self) -> bool:
        return self.steps_that_matter < self.steps


class ProblemMeta(BaseModel):
    """Facts about one problem kept as data (see problems/level3_meta.json)."""

    model_config = ConfigDict(extra="forbid")

    output_shape: list[int] | list[list[int]] | None = None
    """Full-size output shape (a list of shapes when the model returns a tuple)."""
    params: int | None = None
    """Number of parameters of the full-size model."""
    degenerate_at: float | None = None
    """Smallest tolerance at which the output no longer depends on the input (1e-4 or 1e-2):
    at that tolerance and above, a constant tensor passes the correctness check."""
    degenerate_reason: str | None = None
    degenerate_probe: Literal["reparam", "scaled_inputs"] | None = None
    """What makes a constant output fail on a degenerate problem: `scaled_inputs` (every
    floating input of every call becomes `degenerate_input_scale` * x + `degenerate_input_shift`,
    under which the output depends on the input) or `reparam` (a second model built under
    another seed); None when neither does (see scripts/probe_degenerate.py)."""
    degenerate_input_scale: float | None = None
    degenerate_input_shift: float | None = None
    tf32_sensitive_at: float | None = None
    """Largest tolerance at which the default-TF32 reference fails against strict fp32
    (None: within 1e-4)."""
    prefix: PrefixSensitivity | None = None
    """Sequence problems: how many steps move the output (None: not a sequence problem)."""
    notes: str | None = None

    def flags(self) -> list[str]:
        out = []
        if self.degenerate_at is not None:
            out.append(f"degenerate@{_tol(self.degenerate_at)}")
        if self.tf32_sensitive_at is not None:
            out.append(f"tf32@{_tol(self.tf32_sensitive_at)}")
        if self.prefix is not None and self.prefix.insensitive:
            out.append(f"prefix_insensitive@{_tol(self.prefix.tol)}")
        return out


class Problem(BaseModel):
    """One reference problem file."""

    model_config = ConfigDict(frozen=True)

    level: int | None
    number: int | None
    name: str
    """The part of the file stem after the number, e.g. `LeNet5`."""
    stem: str
    """The file stem, e.g. `4_LeNet5`."""
    path: Path
    source: str
    sha256: str
    """sha256 of the source with comments and whitespace normalised (see `normalized_hash`)."""
    meta: ProblemMeta = ProblemMeta()

    @property
    def id(self) -> str:
        if self.level is not None and self.number is not None:
            return f"L{self.level}/{self.number}"
        return self.stem

    @property
    def qualified_stem(self) -> str:
        return f"level{self.level}/{self.stem}" if self.level is not None else self.stem

    def load_module(self, overrides: dict[str, Any] | None = None) -> ModuleType:
        """Execute the problem file as a fresh module; then apply constant overrides."""
        return load_module(self.path, overrides)


def normalized_hash(source: str) -> str:
    """sha256 of the token stream without comments or layout, so reformatting keeps the hash."""
    parts: list[str] = []
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.ENCODING, tokenize.ENDMARKER}
    markers = {tokenize.NEWLINE: ";", tokenize.INDENT: "{", tokenize.DEDENT: "}"}
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type in skip:
                continue
            parts.append(markers.get(tok.type, tok.string))
        text = " ".join(parts)
    except (tokenize.TokenError, IndentationError, SyntaxError):
        text = " ".join(source.split())
    return hashlib.sha256(text.encode()).hexdigest()


def check_problem_source(source: str, path: Path) -> None:
    """Raise `ProblemError` naming the file and the missing piece if the file is unusable."""
    try:
        tree = ast.parse(source, filename=str(path))
    except SyntaxError as e:
        raise ProblemError(f"{path}: syntax error at line {e.lineno}: {e.msg}") from None
    defined = {
        n.name
        for n in tree.body
        if isinstance(n, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
    }
    for node in tree.body:
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            defined |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.ImportFrom | ast.Import):
            defined |= {(a.asname or a.name).split(".")[0] for a in node.names}
    missing = [n for n in REQUIRED_NAMES if n not in defined]
    if missing:
        raise ProblemError(
            f"{path}: not a KernelBench problem file: missing {', '.join(missing)} "
            f"(a problem defines class Model, get_inputs() and get_init_inputs())"
        )


def reference_as_candidate(problem_source: str) -> str:
    """A problem's reference module as a candidate: its own code, with `Model` named `ModelNew`
    everywhere (the class, `super(Model, self)`), as an honest plain-PyTorch candidate is (identity
    runs, `bench/identity.py`: the same code on both sides of every speedup)."""
    return re.sub(r"(?<![\w.])Model\b", "ModelNew", problem_source)


def load_module(path: Path, overrides: dict[str, Any] | None = None) -> ModuleType:
    """Import `path` under a unique module name; module constants are then overridden."""
    safe = re.sub(r"\W", "_", path.stem)
    name = f"kloop_problem_{next(_module_counter)}_{safe}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ProblemError(f"{path}: cannot be imported")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for key, value in (overrides or {}).items():
        if not hasattr(module, key):
            raise ProblemError(f"{path}: override {key!r} names no module-level constant")
        setattr(module, key, value)
    return module


def _problem_from_file(path: Path, level: int | None, meta: dict[str, ProblemMeta]) -> Problem:
    source = path.read_text()
    check_problem_source(source, path)
    m = _STEM_RE.match(path.stem)
    number, name = (int(m.group(1)), m.group(2)) if m else (None, path.stem)
    return Problem(
        level=level,
        number=number,
        name=name,
        stem=path.stem,
        path=path.resolve(),
        source=source,
        sha256=normalized_hash(source),
        meta=meta.get(path.stem, ProblemMeta()),
    )


def _problem_files(folder: Path) -> list[Path]:
    files = [p for p in folder.glob("*.py") if not p.name.startswith("_")]

    def key(p: Path) -> tuple[int, str]:
        m = _STEM_RE.match(p.stem)
        return (int(m.group(1)) if m else 1 << 30, p.stem)

    return sorted(files, key=key)


class ProblemSet:
    """An ordered collection of problems with lookup by id, stem or `levelN/stem`."""

    def __init__(self, problems: list[Problem], root: Path):
        self.problems = problems
        self.root = root

    def __iter__(self):
        return iter(self.problems)

    def __len__(self) -> int:
        return len(self.problems)

    def levels(self) -> list[int | None]:
        return sorted({p.level for p in self.problems}, key=lambda x: (x is None, x or 0))

    def filter(self, level: int | None = None) -> list[Problem]:
        return [p for p in self.problems if level is None or p.level == level]

    @cached_property
    def _index(self) -> dict[str, Problem]:
        index: dict[str, Problem] = {}
        ambiguous: set[str] = set()
        for p in self.problems:
            for key in {p.id.lower(), p.qualified_stem.lower(), p.stem.lower()}:
                if key in index and index[key] is not p:
                    ambiguous.add(key)
                index[key] = p
        for key in ambiguous:
            del index[key]
        return index

    def get(self, problem_id: str) -> Problem:
        """Resolve `L3/4`, `4_LeNet5` or `level3/4_LeNet5` (case-insensitive)."""
        key = problem_id.strip().lower().removesuffix(".py")
        key = re.sub(r"^level(\d+)[/_:-](\d+)$", r"l\1/\2", key)
        if key in self._index:
            return self._index[key]
        if key.isdigit() and len({p.level for p in self.problems}) == 1:
            hits = [p for p in self.problems if p.number == int(key)]
            if len(hits) == 1:
                return hits[0]
        names = sorted({p.id for p in self.problems} | {p.stem for p in self.problems})
        close = difflib.get_close_matches(problem_id, names, n=5, cutoff=0.5)
        by_name = [p.id + " " + p.stem for p in self.problems if key in p.stem.lower()][:5]
        hint = close or by_name
        msg = f"unknown problem {problem_id!r} in {self.root}"
        if hint:
            msg += "; close matches: " + ", ".join(hint)
        else:
            msg += f"; ids look like {self.problems[0].id} or {self.problems[0].stem}" if self.problems else ""
        raise ProblemError(msg)


def _load_meta(folder: Path) -> dict[str, ProblemMeta]:
    meta_file = BUNDLED_DIR / f"{folder.name}_meta.json"
    if folder.resolve().parent != BUNDLED_DIR or not meta_file.exists():
        return {}
    raw = json.loads(meta_file.read_text())
    return {stem: ProblemMeta(**fields) for stem, fields in raw["problems"].items()}


def load_problem_set(problems_dir: Path | str | None = None) -> ProblemSet:
    """Load the bundled Level 3 set, or any KernelBench-format directory.

    `problems_dir` may be a KernelBench checkout's `KernelBench/` folder (with `level1`..`level4`
    subfolders), a single `levelN` folder, or a flat folder of problem files.
    """
    root = Path(problems_dir) if problems_dir is not None else BUNDLED_DIR
    if not root.is_dir():
        raise ProblemError(f"problems directory {root} does not exist")
    level_dirs = sorted(
        (int(m.group(1)), d)
        for d in root.iterdir()
        if d.is_dir() and (m := _LEVEL_DIR_RE.match(d.name))
    )
    problems: list[Problem] = []
    if level_dirs:
        for level, folder in level_dirs:
            meta = _load_meta(folder)
            problems += [_problem_from_file(f, level, meta) for f in _problem_files(folder)]
    else:
        m = _LEVEL_DIR_RE.match(root.name)
        level = int(m.group(1)) if m else None
        problems = [_problem_from_file(f, level, {}) for f in _problem_files(root)]
    if not problems:
        raise ProblemError(f"no problem files (*.py) found in {root}")
    return ProblemSet(problems, root)


_default: ProblemSet | None = None


def get_problem(problem_id: str, problems_dir: Path | str | None = None) -> Problem:
    """Look a problem up in the bundled set, or in `problems_dir`."""
    global _default
    if problems_dir is not None:
        return load_problem_set(problems_dir).get(problem_id)
    if _default is None:
        _default = load_problem_set()
    return _default.get(problem_id)
