"""kloop: agentic multi-turn GPU-kernel generation with an evaluator you can trust.

Everything imports under this one name: `kloop.agent`, `kloop.evaluator`, `kloop.problems`,
`kloop.prompts`. An installed wheel holds those folders inside this package; in a clone they sit
beside it at the top of the repository (the layout the design card fixes), so a clone adds the
repository to this package's path. Children of the evaluator import kloop with only `ROOT` on
their `PYTHONPATH`, so this works with no installed finder at all."""

from __future__ import annotations

import os

ROOT = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
"""The directory that holds the `kloop` package: the clone, or site-packages for a wheel."""

# A clone: the sibling folders are this package's subpackages. Checked by a file a wheel never
# installs, so an unrelated top-level `evaluator` in site-packages is never picked up.
if os.path.isfile(os.path.join(ROOT, "pyproject.toml")) and \
        os.path.isfile(os.path.join(ROOT, "evaluator", "__init__.py")):
    __path__.append(ROOT)  # type: ignore[name-defined]  # noqa: F821
