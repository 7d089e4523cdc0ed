"""Kernel extraction: the last python block; model faults for everything else."""

from __future__ import annotations

import pytest
from kloop.agent.errors import FormatError, NoKernelFound
from kloop.agent.extract import extract_code

NEW = "class ModelNew(nn.Module):\n    pass\n"


def test_the_last_python_block_wins():
    text = f"Plan.\n```python\nold = 1\n{NEW}```\nBetter:\n```python\nnew = 2\n{NEW}```\nDone."
    assert extract_code(text) == f"new = 2\n{NEW}"


def test_tags_and_untagged_blocks():
    assert extract_code(f"```py\n{NEW}```") == NEW
    assert extract_code(f"```\n{NEW}```") == NEW
    # A tagged python block beats a later untagged one (often shell output or a diff).
    assert extract_code(f"```python\n{NEW}```\n```\n$ make\n```") == NEW
    # A cpp block after the python one is ignored; the fence can be longer or indented.
    assert extract_code(f"  ````python\n{NEW}  ````\n```cpp\nint x;\n```") == NEW


def test_python_block_containing_backticks_in_strings():
    code = 'src = r"""\n// uses ``` in a comment\n"""\n' + NEW
    assert extract_code(f"````python\n{code}````") == code


@pytest.mark.parametrize(
    ("text", "error", "match"),
    [
        ("No code at all.", NoKernelFound, "no fenced"),
        ("```cpp\nint main() {}\n```", NoKernelFound, r"none in Python"),
        ("```python\nx = 1\n```", FormatError, "class ModelNew"),
        (f"```python\n{NEW}", FormatError, "never closed"),
        (f"```python\n{NEW}```\n```python\nclass ModelNew", FormatError, "never closed"),
    ],
)
def test_model_faults(text, error, match):
    with pytest.raises(error, match=match):
        extract_code(text)


def test_truncation_is_named():
    with pytest.raises(FormatError, match="finish_reason=length"):
        extract_code(f"```python\n{NEW}", finish_reason="length")
