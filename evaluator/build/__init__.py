"""Compilers and caches: `load_inline` builds (`buildcache`, in the child that imports the
candidate), the harness's store of verified build artefacts (`buildstore`), nvcc compile checks
without a GPU (`nvcc`), Triton's sm_90 check (`triton_aot`) and compiler-log parsing
(`diagnostics`)."""
