"""The trusted side: code that runs only in the harness process. It measures, compares and
decides; it never imports or runs candidate code."""
