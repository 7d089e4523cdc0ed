"""Reports on runs and experiments: metrics, budget curves, plots, Markdown/HTML/JSON pages.

Everything is computed from run directories (`load`), never from a process's memory:
`build.build_report(paths)` gives the numbers, `build.write_report(report, out)` the pages.
"""
