"""bench/experiment.py, the throughput figure of record: its generated batch is what it says for
every Level 3 problem, and the bench runs end to end on CPU (the Triton interpreter; CUDA
candidates are only compile-checked without a GPU, so the CPU run leaves them out)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _bench(name: str):
    """A bench script as a module (each takes its own folder off sys.path when imported: it holds
    bench/evaluator.py; `main` puts it back for its own imports)."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location(f"bench_{name}", REPO / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # what a dataclass of the module looks itself up in
    spec.loader.exec_module(module)
    return module


experiment = _bench("experiment")

from kloop.evaluator.common.backend import detect_backend  # noqa: E402
from kloop.evaluator.harness.precheck import precheck_source  # noqa: E402
from kloop.evaluator.harness.static import static_violations  # noqa: E402
from kloop.problems.registry import get_problem, load_problem_set  # noqa: E402

BACKEND = {"reference": "torch", "cuda_lean": "cuda", "cuda_torch": "cuda", "triton": "triton",
           "wrong": "torch"}


@pytest.mark.parametrize("kind", sorted(BACKEND))
def test_every_problems_generated_candidate_passes_the_static_stage_as_its_backend(kind):
    for prob in load_problem_set(None).filter(3):
        src = experiment.candidate(prob.source, kind, prob.stem.split("_")[0])
        assert precheck_source(src) is None, (prob.id, kind)
        assert detect_backend(src) == BACKEND[kind], (prob.id, kind)
        rejected = [v for v in static_violations(src) if v.severity == "reject"]
        assert rejected == [], (prob.id, kind, rejected)


def test_the_two_cuda_forms_differ_only_in_where_torch_is_named():
    src = get_problem("L3/1").source
    lean = experiment.candidate(src, "cuda_lean", "1")
    plain = experiment.candidate(src, "cuda_torch", "1")
    lean_cu = lean.split('_cuda = r"""')[1].split('"""')[0]
    plain_cu = plain.split('_cuda = r"""')[1].split('"""')[0]
    assert "torch" not in lean_cu and "#include" not in lean_cu
    assert "#include <torch/extension.h>" in plain_cu
    assert experiment._CUDA_KERNEL.strip() in lean_cu and experiment._CUDA_KERNEL.strip() in plain_cu


def test_the_torch_form_candidate_splits_and_each_builds_path_is_named():
    """The `torch/extension.h` copy kernel is one the torch-form build takes (not refused), and
    the summary names each path a build reported."""
    from kloop.evaluator.build import torch_form

    src = get_problem("L3/1").source
    cu = experiment.candidate(src, "cuda_torch", "1").split('_cuda = r"""')[1].split('"""')[0]
    assert torch_form.split(cu).launched == ["kloop_copy_kernel"]
    runs = {"torch form (host pch)": "torch form", "torch form refused: a raw string literal":
            "torch form refused", "lean": "lean", "lean refused: it names `at`": "lean refused"}
    for run, path in runs.items():
        assert experiment.build_path({"nvcc_runs": [run, "split"]}) == path
    assert experiment.build_path({"nvcc_runs": ["split"]}) == "plain"


def test_projection_charges_each_problem_its_first_use_and_each_candidate_the_steady_rate():
    first = {"candidates": 6, "problems": 2, "wall_s": 100.0, "per_gpu_hour": 216.0}
    steady = {"candidates": 6, "problems": 2, "wall_s": 30.0, "per_gpu_hour": 720.0}
    p = experiment.project(first, steady)
    assert p["steady_per_candidate_s"] == pytest.approx(5.0)
    assert p["first_use_per_problem_s"] == pytest.approx((100.0 - 6 * 5.0) / 2)
    assert p["projected_wall_s"] == pytest.approx(50 * 35.0 + 800 * 5.0)
    assert experiment.project(first, None) is None


def _part(label: str, ids: list[str], wall: float, steady_wall: float | None, builds: list[float],
          **conditions) -> dict:
    def figures(w: float) -> dict:
        paths = {"cuda_torch": {"torch form": len(builds)}}
        return experiment._figures(3 * len(ids), len(ids), w, w / 4, {"cuda_torch": builds},
                                   paths, {"correct": 2 * len(ids), "compile_error": len(ids)})
    return {"conditions": {"device": "cuda", "size": "full", "concurrency": 8, "gpu": "NVIDIA H100 80GB HBM3", "part": label,
                           "problem_ids": ids, "started": "t", "judging_code": "d1",
                           "batch_code": "b1", **conditions},
            "first_use_included": figures(wall),
            "steady_state": figures(steady_wall) if steady_wall else None}


def test_parts_on_machines_of_their_own_add_up_to_one_figure():
    a = _part("1/2", ["L3/1", "L3/3"], 100.0, 20.0, [9.0, 10.0])
    b = _part("2/2", ["L3/2"], 80.0, 10.0, [30.0])
    got = experiment.combine([a, b])
    first, steady = got["first_use_included"], got["steady_state"]
    # One machine running both parts in turn: every part's first use is charged.
    assert (first["candidates"], first["problems"], first["wall_s"]) == (9, 3, 180.0)
    assert first["per_gpu_hour"] == pytest.approx(9 / 180.0 * 3600)
    assert first["gpu_busy_real_work"] == pytest.approx((25.0 + 20.0) / 180.0)
    # The median of all builds, not of the parts' medians (9.5 and 30).
    assert first["build_p50_s"] == {"cuda_torch": 10.0}
    assert first["build_paths"] == {"cuda_torch": {"torch form": 3}}
    assert first["statuses"] == {"correct": 6, "compile_error": 3}
    assert steady["wall_s"] == 30.0
    assert got["projection"] == experiment.project(first, steady)
    assert got["conditions"]["problem_ids"] == ["L3/1", "L3/3", "L3/2"]
    # Each part's company on its host is kept (a part from before the flag ran alone).
    assert got["conditions"]["host_parts"] == [1, 1]
    beside = experiment.combine([a, _part("2/2", ["L3/2"], 80.0, 10.0, [30.0], host_parts=8)])
    assert beside["conditions"]["host_parts"] == [1, 8]
    # A part without a steady pass leaves the combined one out, and the projection with it.
    assert experiment.combine([a, _part("2/2", ["L3/2"], 80.0, None, [30.0])])["projection"] is None
    # Whether each part's machine was fresh is kept with the figure (older parts: unrecorded).
    warm = _part("2/2", ["L3/2"], 80.0, 10.0, [30.0], host={"state": "warm", "earlier_runs": 1})
    assert experiment.combine([a, warm])["conditions"]["hosts"] == ["unrecorded", "warm"]


def test_a_run_on_a_machine_an_earlier_run_used_is_marked_warm(tmp_path):
    mark = tmp_path / "host.jsonl"
    assert experiment.host_of(mark) == {"state": "fresh", "earlier_runs": 0}
    assert experiment.host_of(mark) == {"state": "warm", "earlier_runs": 1}
    mark.write_text(mark.read_text() + "not json\n")
    assert experiment.host_of(mark) == {"state": "warm", "earlier_runs": 2}


def test_a_part_run_in_two_calls_is_one_part():
    """Its first pass on a fresh machine, then `--steady-only` in the next call of the same
    machine: the two files are one part (the first-use figures of the one, the steady figures of
    the other), beside parts run whole."""
    a = _part("1/2", ["L3/1", "L3/3"], 100.0, 20.0, [9.0, 10.0])
    first = _part("2/2", ["L3/2"], 80.0, None, [30.0])
    steady = {**_part("2/2", ["L3/2"], 1.0, 10.0, [1.0]), "first_use_included": None}
    got = experiment.combine([a, first, steady])
    assert got["conditions"]["parts"] == ["1/2", "2/2+steady"]
    assert got["first_use_included"]["wall_s"] == 180.0  # the halves' first pass only
    assert got["steady_state"]["wall_s"] == 30.0
    assert got["projection"] == experiment.project(got["first_use_included"],
                                                   got["steady_state"])
    with pytest.raises(ValueError, match="a steady pass without its first pass"):
        experiment.combine([a, steady])


@pytest.mark.parametrize("other, why", [
    (_part("2/2", ["L3/2"], 80.0, 10.0, [1.0], size="small"), "parts differ"),
    (_part("2/2", ["L3/2"], 80.0, 10.0, [1.0], concurrency=4), "parts differ"),
    (_part("1/3", ["L3/3"], 80.0, 10.0, [1.0]), "more than one part: L3/3"),
    (_part("2/2", ["L3/2"], 80.0, 10.0, [1.0], warm_up=False), "parts differ"),
    (_part("2/2", ["L3/2"], 80.0, 10.0, [1.0], gpu="NVIDIA H200"), "parts differ"),
    (_part("2/2", ["L3/2"], 80.0, 10.0, [1.0], judging_code="d2"), r"judging_code \(d1 vs d2\)"),
    (_part("2/2", ["L3/2"], 80.0, 10.0, [1.0], batch_code="b2"), r"batch_code \(b1 vs b2\)"),
    (_part("2/2", ["L3/2"], 80.0, 10.0, [1.0], candidate_hold="untimed_shared"),
     "parts differ in candidate_hold"),
])
def test_parts_that_do_not_add_up_are_refused(other, why):
    with pytest.raises(ValueError, match=why):
        experiment.combine([_part("1/2", ["L3/1", "L3/3"], 100.0, 20.0, [9.0]), other])


def test_a_cut_part_leaves_partial_figures_that_combine_refuses(tmp_path, monkeypatch):
    """After every finished candidate the `--json` file says what the pass had done: a part
    that its device call's limit cuts keeps its figures, marked partial, and is never added
    into the figure of record."""
    monkeypatch.syspath_prepend(str(Path(experiment.__file__).parent))  # as `main` does
    items = [{"label": f"L3/1 {k}", "kind": k} for k in ("reference", "wrong", "syntax")]
    conditions = {"device": "cpu", "part": "1/2", "problem_ids": ["L3/1"]}
    out = tmp_path / "part.json"
    write = experiment._partial_writer(out, conditions, items, 1)("first_use_included")
    rows = [{"label": "L3/1 reference", "status": "correct", "stages": {"candidate_held": 2.0},
             "device_ms": 500.0, "done_at_s": 30.0}]
    write({"wall_s": 30.0, "rows": rows, "warm_s": 10.0})
    doc = json.loads(out.read_text())
    assert doc["partial"] == {"pass": "first_use_included", "finished": 1, "of": 3}
    first = doc["first_use_included"]
    assert (first["candidates"], first["wall_s"], first["held_s"]) == (1, 40.0, 2.0)
    with pytest.raises(ValueError, match="partial"):
        experiment.combine([doc, _part("2/2", ["L3/2"], 80.0, 10.0, [1.0])])


def test_a_part_whose_steady_pass_was_cut_keeps_its_finished_first_pass():
    """The call's limit cut the steady pass: the first pass counts alone and joins the
    `--steady-only` file of the same problems; the cut steady figures never count."""
    a = _part("1/2", ["L3/1", "L3/3"], 100.0, 20.0, [9.0, 10.0])
    cut = {**_part("2/2", ["L3/2"], 80.0, 5.0, [30.0]),
           "partial": {"pass": "steady_state", "finished": 2, "of": 3}}
    steady = {**_part("2/2", ["L3/2"], 1.0, 10.0, [1.0]), "first_use_included": None}
    got = experiment.combine([a, cut, steady])
    assert got["conditions"]["parts"] == ["1/2", "2/2+steady"]
    assert got["first_use_included"]["wall_s"] == 180.0
    assert got["steady_state"]["wall_s"] == 30.0  # 20 + the steady-only file's 10, not the cut 5
    cut_first = {**cut, "partial": {"pass": "first_use_included", "finished": 2, "of": 3}}
    with pytest.raises(ValueError, match="partial"):
        experiment.combine([a, cut_first, steady])


@pytest.mark.slow
def test_the_bench_runs_a_first_use_and_a_steady_pass_on_cpu(tmp_path):
    out = tmp_path / "e.json"
    rc = experiment.main(["--device", "cpu", "--problems", "L3/1", "--size", "small",
                          "--kinds", "triton,syntax,wrong", "--concurrency", "2",
                          "--cache", str(tmp_path / "cache"), "--steady",
                          "--rows", str(tmp_path / "rows.jsonl"), "--json", str(out)])
    assert rc == 0
    data = json.loads(out.read_text())
    assert "partial" not in data  # the finished run wrote its whole file over the partial one
    for name in ("first_use_included", "steady_state"):
        s = data[name]
        assert s["statuses"] == {"correct": 1, "compile_error": 1, "incorrect": 1}, s
        assert s["candidates"] == 3 and s["per_gpu_hour"] > 0
    # First use begins with the warm-up (`kloop baseline`'s code), on the clock; the steady
    # pass finds the baselines cached and has none.
    warm = data["first_use_included"]["warm_up_s"]
    assert 0 < warm < data["first_use_included"]["wall_s"]
    assert data["steady_state"]["warm_up_s"] is None and data["conditions"]["warm_up"] is True
    assert data["conditions"]["gpu"] is None  # on CPU; the GPU's model name on a GPU
    rows = [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()]
    first_rows = rows[:3]  # the first pass's
    assert data["first_use_included"]["held_s"] == pytest.approx(sum(
        r["stages"].get("reference_held", 0) + r["stages"].get("candidate_held", 0)
        for r in first_rows))
    assert data["first_use_included"]["held_s"] > 0
    assert data["projection"]["projected_wall_s"] > 0
    assert data["conditions"]["size"] == "small" and data["conditions"]["cache"] == "given"
    rows = [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()]
    assert len(rows) == 6
    correct = [r for r in rows if r["status"] == "correct"]
    assert all(r["device_ms"] > 0 for r in correct)  # timed calls and the eager baseline
    # A second part, as run on another machine, and the two added up by --combine.
    other = tmp_path / "other.json"
    assert experiment.main(["--device", "cpu", "--problems", "L3/1,L3/4", "--part", "2/2",
                            "--size", "small", "--kinds", "syntax", "--concurrency", "2",
                            "--json", str(other)]) == 0
    data["conditions"]["part"] = "1/2"  # the run above took every problem, under no --part
    (tmp_path / "one.json").write_text(json.dumps(data))
    assert experiment.main(["--combine", str(tmp_path / "one.json"), str(other),
                            "--json", str(tmp_path / "all.json")]) == 0
    both = json.loads((tmp_path / "all.json").read_text())
    assert both["conditions"]["problem_ids"] == ["L3/1", "L3/4"]
    assert both["first_use_included"]["candidates"] == 4
    assert both["first_use_included"]["statuses"] == {"correct": 1, "compile_error": 2,
                                                      "incorrect": 1}
    assert both["steady_state"] is None  # the second part ran no steady pass
    assert both["first_use_included"]["held_s"] == pytest.approx(
        data["first_use_included"]["held_s"]
        + json.loads(other.read_text())["first_use_included"]["held_s"])
    assert both["first_use_included"]["warm_up_s"] == pytest.approx(
        warm + json.loads(other.read_text())["first_use_included"]["warm_up_s"])


@pytest.mark.slow
def test_the_repeat_bench_judges_each_candidate_again_and_reports_its_spread(tmp_path):
    """bench/repeat.py on CPU: every repeat of every fixed candidate judged (the spread of its
    medians is reported; speedups are not measured on CPU, so theirs is empty)."""
    repeat = _bench("repeat")
    out = tmp_path / "r.json"
    assert repeat.main(["--device", "cpu", "--size", "small", "--problems", "L3/1",
                        "--kinds", "reference", "--repeats", "2", "--builds", "0",
                        "--concurrency", "2", "--cache", str(tmp_path / "c"),
                        "--json", str(out)]) == 0
    table = json.loads(out.read_text())["candidates"]
    assert set(table) == {"L3/1 reference"}
    for f in table.values():
        assert (f["repeats"], f["correct"]) == (2, 2), f
        assert len(f["median_ms"]) == 2 and f["median_cv_pct"] is not None
        assert f["speedup_vs_eager"] == [] and f["speedup_vs_eager_cv_pct"] is None


def test_cv_is_the_spread_over_the_mean_and_needs_two_values():
    repeat = _bench("repeat")
    assert repeat.cv([1.0]) is None
    assert repeat.cv([1.0, 1.0, 1.0]) == 0.0
    assert repeat.cv([0.9, 1.1]) == pytest.approx(0.1414213 / 1.0 * 100, rel=1e-5)


def test_the_primer_warms_each_problems_baselines_and_the_first_build_of_each_kind():
    items = experiment.batch(["L3/1", "L3/4"], list(experiment.KINDS), "small")
    labels = [it["label"] for it in experiment.primer_of(items)]
    assert labels == ["L3/1 reference", "L3/1 cuda_lean", "L3/1 cuda_torch", "L3/1 triton",
                      "L3/4 reference"]
    assert experiment.primer_of([]) == []


def test_rows_without_device_time_leave_busy_unmeasured_never_zero(monkeypatch):
    """The old path's inner runs make rows without the device time of their timed calls: the
    figure is not measured, never 0 %; where every row has it, it is their sum over the wall."""
    # summarise imports `throughput` (bench/throughput.py, put on the path by `main`).
    monkeypatch.setitem(sys.modules, "throughput", _bench("throughput"))
    items = [{"label": "L3/1 reference", "kind": "reference"}]
    row = {"label": "L3/1 reference", "status": "correct", "stages": {"candidate_held": 2.0}}
    bare = experiment.summarise({"rows": [row], "wall_s": 10.0}, items, 1)
    assert bare["busy_s"] is None and bare["gpu_busy_real_work"] is None
    assert bare["held_s"] == 2.0 and bare["per_gpu_hour"] == 360.0
    timed = experiment.summarise({"rows": [{**row, "device_ms": 2500.0}], "wall_s": 10.0},
                                 items, 1)
    assert timed["busy_s"] == 2.5 and timed["gpu_busy_real_work"] == 0.25


def test_a_part_without_its_judging_codes_digest_is_refused():
    old = _part("2/2", ["L3/2"], 80.0, 10.0, [1.0])
    del old["conditions"]["judging_code"]
    with pytest.raises(ValueError, match="judging code's or batch's digest"):
        experiment.combine([_part("1/2", ["L3/1"], 100.0, 20.0, [9.0]), old])



def test_the_judging_digest_follows_the_evaluators_files_and_ignores_caches(tmp_path):
    for top in experiment.JUDGING_CODE:
        (tmp_path / top).mkdir()
        (tmp_path / top / "a.py").write_text("x = 1\n")
    before = experiment.judging_digest(tmp_path)
    (tmp_path / "evaluator" / "__pycache__").mkdir()
    (tmp_path / "evaluator" / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"\0")
    (tmp_path / "bench.py").write_text("not judging code\n")
    assert experiment.judging_digest(tmp_path) == before
    (tmp_path / "evaluator" / "a.py").write_text("x = 2\n")
    changed = experiment.judging_digest(tmp_path)
    assert changed != before
    # A file moved from one place to another is another evaluator.
    (tmp_path / "evaluator" / "a.py").write_text("x = 1\n")
    (tmp_path / "problems" / "a.py").rename(tmp_path / "problems" / "b.py")
    assert experiment.judging_digest(tmp_path) not in (before, changed)


def test_the_batch_digest_follows_the_candidates_templates(monkeypatch):
    before = experiment.batch_digest()
    monkeypatch.setattr(experiment, "_WRAP", experiment._WRAP.replace("_copy(out)", "out"))
    assert experiment.batch_digest() != before


def test_a_part_that_does_not_say_its_problems_is_refused():
    old = _part("2/2", ["L3/2"], 80.0, 10.0, [1.0])
    del old["conditions"]["problem_ids"]
    with pytest.raises(ValueError, match="without its problem ids"):
        experiment.combine([_part("1/2", ["L3/1"], 100.0, 20.0, [9.0]), old])


def test_a_row_keeps_a_failures_first_line_even_when_it_has_no_message():
    from types import SimpleNamespace

    from kloop.evaluator.common.result import ErrorInfo

    def result(message: str):
        return SimpleNamespace(compile=None, backend="torch", timing=None, eager=None, paired=None,
                               compiled=None, compiled_ro=None, speedup_ci={},
                               error=ErrorInfo(type="OutOfMemoryError", message=message))

    assert experiment.row_of(result("CUDA out of memory.\nTried to allocate 8 GiB"))["error"] == \
        "OutOfMemoryError: CUDA out of memory."
    row = experiment.row_of(result(""))
    assert row["error"] == "OutOfMemoryError: "
    # A failure made no timed call and was never stopped by the sequential rule.
    assert row["calls_made"] is None and row["stopped_early"] is None and row["speedups"] == {}


@pytest.mark.slow
def test_a_steady_only_pass_runs_on_the_first_passs_cache_after_priming_off_the_clock(
        tmp_path, monkeypatch):
    from kloop.evaluator.common.config import POLICIES

    # `--compare-stop-width` registers `strict_stop` in this process: gone after the test.
    monkeypatch.setitem(POLICIES, "strict_stop", POLICIES["strict"])
    cache, args = tmp_path / "cache", ["--device", "cpu", "--problems", "L3/1", "--size", "small",
                                       "--kinds", "reference,wrong", "--concurrency", "2"]
    assert experiment.main([*args, "--cache", str(cache), "--json", str(tmp_path / "a.json")]) == 0
    rows = tmp_path / "rows.jsonl"
    assert experiment.main([*args, "--cache", str(cache), "--steady-only", "--rows", str(rows),
                            "--json", str(tmp_path / "b.json"),
                            "--compare-stop-width", "0.02",
                            "--compare-candidate-hold", "untimed_shared"]) == 0
    first, steady = (json.loads((tmp_path / f).read_text()) for f in ("a.json", "b.json"))
    assert first["steady_state"] is None and steady["first_use_included"] is None
    assert steady["conditions"]["passes"] == "steady" and steady["conditions"]["primed_s"] > 0
    assert steady["conditions"]["primer"] == ["L3/1 reference"]
    s = steady["steady_state"]
    assert s["statuses"] == {"correct": 1, "incorrect": 1} and s["warm_up_s"] is None, s
    # Then the same batch with the sequential rule, in the same process (on CPU its five timed
    # calls are too few rounds for the rule to look: plumbing only).
    rule = steady["steady_state_stop_rule"]
    assert rule["statuses"] == {"correct": 1, "incorrect": 1} and rule["ratio_to_steady"] > 0
    assert steady["compare_stop_width"] == 0.02
    # And with the other candidate hold (on CPU nothing is locked: plumbing only).
    hold = steady["steady_state_candidate_hold"]
    assert hold["statuses"] == {"correct": 1, "incorrect": 1} and hold["ratio_to_steady"] > 0
    assert steady["compare_candidate_hold"] == "untimed_shared"
    made = [json.loads(x) for x in rows.read_text().splitlines()]
    assert len(made) == 6  # two a pass; the primer's candidate is not a row
    assert [r["stopped_early"] for r in made if r["status"] == "correct"] == [False] * 3
    both = experiment.combine([first, steady])
    assert both["steady_state"] == s and both["projection"] is not None
    with pytest.raises(SystemExit, match="replaces --steady"):
        experiment.main([*args, "--cache", str(cache), "--steady-only", "--steady"])


_OLD_CONFIG = '''
class EvalConfig:
    def __init__(self, **fields):
        self.fields = fields
'''
_OLD_PIPELINE = '''
from pathlib import Path
from types import SimpleNamespace

def evaluate(problem, source, config):
    # Says which checkout judged it: the old path's own code, never this one's.
    return SimpleNamespace(status="old:" + Path(__file__).parents[1].name, flags=[],
                           stage_seconds={"candidate": 0.01})
'''


def test_the_old_path_runs_through_the_old_checkouts_own_evaluator(tmp_path):
    """`--old-root` of a checkout from before one import name (its evaluator the top-level
    package `evaluator`, as at 69bdd97) runs the batch through that checkout's `evaluator.config`
    and `evaluator.pipeline`, in a process whose PYTHONPATH is that checkout; this checkout's own
    layout is told apart from it. (A stand-in old checkout: the real 69bdd97 needs a GPU to be
    a figure.)"""
    throughput = _bench("throughput")
    old = tmp_path / "oldcheckout"
    (old / "evaluator").mkdir(parents=True)
    (old / "evaluator" / "__init__.py").write_text("")
    (old / "evaluator" / "config.py").write_text(_OLD_CONFIG)
    (old / "evaluator" / "pipeline.py").write_text(_OLD_PIPELINE)
    assert throughput.old_api(old) and not throughput.old_api(REPO)
    items = [{"label": f"L3/{k} reference", "problem": f"L3/{k}", "kind": "reference",
              "source": "x = 1\n", "overrides": {}} for k in (1, 4)]
    batch_file = tmp_path / "batch.json"
    batch_file.write_text(json.dumps(items))
    p = throughput.inner_run(old, batch_file, "cpu", 2)
    assert p.returncode == 0
    res = json.loads(p.stdout.strip().splitlines()[-1])
    assert [r["status"] for r in res["rows"]] == ["old:oldcheckout"] * 2
    assert [r["label"] for r in res["rows"]] == ["L3/1 reference", "L3/4 reference"]
