"""Trusted: the harness's process plumbing (sandbox, isolation, fork server, locks, uid pool, scheduler, /proc). Never imported by code that runs in a worker."""
