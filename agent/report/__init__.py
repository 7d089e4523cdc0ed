"""Reports on runs and experiments: metrics, budget curves, plots, Markdown/HTML/JSON pages.

Everything is computed from run directories (`load`), never from a process's memory:
`build.build_report(paths)` gives the numbers, `build.write_report(report, out)` the pages.
"""

DEFAULT_BOOTSTRAP = 1000
"""Bootstrap resamples of every report (`kloop report`, the demo's): the same data gives the
same intervals wherever the report is made."""
