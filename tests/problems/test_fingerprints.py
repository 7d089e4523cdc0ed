"""All 50 Level 3 problems against the numeric fingerprints of the official KernelBench files.

Each problem is rebuilt the KernelBench way at the fingerprint's reduced sizes: state_dict keys,
order, shapes and dtypes must be identical, parameter sums equal to ~1e-12, outputs for seeds 0
and 1 equal to about 1e-6 relative. This also runs every problem's forward on CPU.
"""

import pytest
import torch

from kloop.problems.fingerprint import DEFAULT_FINGERPRINTS, check_problem, load_fingerprints
from kloop.problems.registry import BUNDLED_DIR

FINGERPRINTS = load_fingerprints(DEFAULT_FINGERPRINTS)


def test_fingerprints_cover_all_fifty_problems():
    files = sorted(p.stem for p in (BUNDLED_DIR / "level3").glob("[0-9]*.py"))
    assert len(FINGERPRINTS) == 50
    assert sorted(FINGERPRINTS) == files


@pytest.mark.parametrize("stem", sorted(FINGERPRINTS, key=lambda s: int(s.split("_")[0])))
def test_problem_matches_official_fingerprint(stem):
    diffs = check_problem(BUNDLED_DIR / "level3" / f"{stem}.py", FINGERPRINTS[stem])
    assert diffs == []


def test_checker_catches_an_extra_random_draw(tmp_path):
    # Negative control: one extra draw before fc1 changes every parameter created after it.
    src = (BUNDLED_DIR / "level3" / "4_LeNet5.py").read_text()
    fc1 = "        self.fc1 = nn.Linear("
    assert fc1 in src
    bad = tmp_path / "4_LeNet5.py"
    bad.write_text(src.replace(fc1, "        torch.rand(1)\n" + fc1))
    diffs = check_problem(bad, FINGERPRINTS["4_LeNet5"])
    assert [d.split(":")[0] for d in diffs] == [
        "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "fc3.weight", "fc3.bias"
    ]


def test_checker_catches_a_registration_order_change(tmp_path):
    src = (BUNDLED_DIR / "level3" / "4_LeNet5.py").read_text()
    fc1 = "        self.fc1 = nn.Linear(in_features=16 * 5 * 5, out_features=120)\n"
    fc2 = "        self.fc2 = nn.Linear(in_features=120, out_features=84)\n"
    assert fc1 + fc2 in src
    bad = tmp_path / "4_LeNet5.py"
    bad.write_text(src.replace(fc1 + fc2, fc2 + fc1))
    diffs = check_problem(bad, FINGERPRINTS["4_LeNet5"])
    assert len(diffs) == 1 and "state_dict keys differ" in diffs[0]


def test_checker_catches_an_output_change(tmp_path):
    src = (BUNDLED_DIR / "level3" / "4_LeNet5.py").read_text()
    bad = tmp_path / "4_LeNet5.py"
    bad.write_text(src.replace("return self.fc3(x)", "return self.fc3(x) * 1.001"))
    diffs = check_problem(bad, FINGERPRINTS["4_LeNet5"])
    assert any("output 0" in d for d in diffs)


def test_a_check_gives_the_callers_thread_count_back():
    """The check runs on the fingerprints' two threads and leaves the caller at its own (the
    suite runs torch on one thread a process; two left behind made LSTM forwards 50-95x slower
    on a 2-core host)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert check_problem(BUNDLED_DIR / "level3" / "4_LeNet5.py", FINGERPRINTS["4_LeNet5"]) == []
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
