"""Problem registry: lookups, errors, hashing and external KernelBench-format directories."""

import shutil

import pytest

from kloop.problems.registry import (
    BUNDLED_DIR,
    ProblemError,
    get_problem,
    load_problem_set,
    normalized_hash,
    reference_as_candidate,
)

LENET = (BUNDLED_DIR / "level3" / "4_LeNet5.py").read_text()


def test_bundled_set_has_fifty_level3_problems_in_order():
    pset = load_problem_set()
    assert len(pset) == 50
    assert [p.number for p in pset] == list(range(1, 51))
    assert {p.level for p in pset} == {3}
    assert pset.problems[0].stem == "1_MLP" and pset.problems[-1].stem == "50_ReLUSelfAttention"


@pytest.mark.parametrize("key", ["L3/4", "l3/4", "4_LeNet5", "level3/4_LeNet5", "4_lenet5.py", "4"])
def test_lookup_forms_resolve_to_the_same_problem(key):
    p = get_problem(key)
    assert (p.id, p.stem, p.name, p.level, p.number) == ("L3/4", "4_LeNet5", "LeNet5", 3, 4)
    assert p.source == LENET


def test_unknown_id_lists_close_matches():
    with pytest.raises(ProblemError) as e:
        get_problem("4_LeNet")
    assert "4_LeNet5" in str(e.value) and "close matches" in str(e.value)
    with pytest.raises(ProblemError, match="L3/99"):
        get_problem("L3/99")


def test_metadata_carries_the_facts():
    assert get_problem("L3/28").meta.degenerate_at == 1e-4
    assert get_problem("L3/46").meta.degenerate_at == 1e-2
    assert get_problem("L3/1").meta.degenerate_at is None
    assert get_problem("L3/10").meta.tf32_sensitive_at == 1e-2
    assert get_problem("L3/4").meta.params == 62_556
    assert get_problem("L3/4").meta.output_shape == [4096, 20]
    assert get_problem("L3/4").meta.flags() == []
    assert get_problem("L3/3").meta.flags() == ["degenerate@1e-4"]
    degenerate = {p.number for p in load_problem_set() if p.meta.degenerate_at is not None}
    assert degenerate == {3, 5, 7, 11, 12, 18, 28, 35, 46, 47}


def test_hash_ignores_comments_and_layout_but_not_code():
    reformatted = "# a comment\n" + LENET.replace("    return [num_classes]", "    return [num_classes]  # init")
    reformatted = reformatted.replace("\n\n\n", "\n\n\n\n")
    assert normalized_hash(reformatted) == normalized_hash(LENET)
    assert normalized_hash(LENET.replace("num_classes = 20", "num_classes = 21")) != normalized_hash(LENET)
    assert get_problem("L3/4").sha256 == normalized_hash(LENET)


def test_load_module_applies_overrides_and_rejects_unknown_names():
    p = get_problem("L3/4")
    mod = p.load_module({"batch_size": 3})
    assert mod.get_inputs()[0].shape == (3, 1, 32, 32)
    with pytest.raises(ProblemError, match="no_such_constant"):
        p.load_module({"no_such_constant": 1})


def test_kernelbench_checkout_layout_with_several_levels(tmp_path):
    for level in (1, 2):
        (tmp_path / f"level{level}").mkdir()
        shutil.copy(BUNDLED_DIR / "level3" / "4_LeNet5.py", tmp_path / f"level{level}" / "7_Thing.py")
    (tmp_path / "level2" / "12_Other.py").write_text(LENET)
    pset = load_problem_set(tmp_path)
    assert [p.id for p in pset] == ["L1/7", "L2/7", "L2/12"]
    assert pset.get("level2/7_Thing").level == 2
    # A bare stem that exists in two levels is ambiguous: the error must say so via matches.
    with pytest.raises(ProblemError):
        pset.get("7_Thing")
    assert pset.get("L1/7").meta.params is None


def test_flat_folder_of_user_problems(tmp_path):
    (tmp_path / "my_attention.py").write_text(LENET)
    (tmp_path / "3_conv.py").write_text(LENET)
    pset = load_problem_set(tmp_path)
    assert [p.id for p in pset] == ["3_conv", "my_attention"]
    assert pset.get("my_attention").number is None


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("def broken(:\n    pass\n", "syntax error at line 1"),
        (LENET.replace("class Model(", "class Net("), "missing Model"),
        (LENET.replace("def get_inputs(", "def make_inputs("), "missing get_inputs"),
    ],
)
def test_malformed_problem_file_names_file_and_missing_piece(tmp_path, source, expected):
    bad = tmp_path / "9_Bad.py"
    bad.write_text(source)
    with pytest.raises(ProblemError) as e:
        load_problem_set(tmp_path)
    assert "9_Bad.py" in str(e.value) and expected in str(e.value)


def test_missing_or_empty_directory_is_a_clear_error(tmp_path):
    with pytest.raises(ProblemError, match="does not exist"):
        load_problem_set(tmp_path / "nope")
    with pytest.raises(ProblemError, match="no problem files"):
        load_problem_set(tmp_path)


@pytest.mark.parametrize("problem", load_problem_set().problems, ids=lambda p: p.id)
def test_every_reference_as_a_candidate_passes_the_static_stage(problem):
    """Identity runs submit each reference as its own candidate (bench/identity.py): renamed,
    it must be a candidate the static stage lets through, with no `Model` left."""
    from kloop.evaluator.harness.checks import ast_rules
    from kloop.evaluator.harness.precheck import precheck_source

    src = reference_as_candidate(problem.path.read_text())
    assert precheck_source(src) is None
    assert [v for v in ast_rules(src, "torch", "strict") if v.severity == "reject"] == []
    assert "class ModelNew(" in src and "class Model(" not in src
