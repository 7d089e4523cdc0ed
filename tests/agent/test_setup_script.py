"""scripts/setup.sh picks torch by the machine, never PyPI's CUDA build where there is no GPU.

KLOOP_SETUP_DRY_RUN=1 makes the script print its torch plan and stop before touching anything.
"""

from __future__ import annotations

import os
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def plan(tmp_path: Path, index: str, gpu: bool = False) -> str:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    if gpu:
        smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H200'\n")
        smi.chmod(0o755)
    elif smi.exists():
        smi.unlink()
    # PATH without any real nvidia-smi: this test's folder, then the basic system tools.
    env = {**os.environ, "KLOOP_SETUP_DRY_RUN": "1", "TORCH_CPU_INDEX": index,
           "PATH": f"{bin_dir}:/usr/bin:/bin"}
    env.pop("TORCH_SPEC", None)
    env.pop("TORCH_PIP_ARGS", None)
    out = subprocess.run(["bash", "scripts/setup.sh"], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


class _Index(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path.rstrip("/").endswith("/torch") else 404)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_no_gpu_and_the_cpu_index_reachable_uses_it(tmp_path):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Index)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/whl/cpu"
        assert plan(tmp_path, url) == f"torch: cpu-index torch==2.13.0 --index-url {url}"
    finally:
        server.shutdown()


def test_no_gpu_and_no_cpu_index_asks_for_a_cpu_build_only(tmp_path):
    # "+cpu" exists only in PyTorch's index or a local copy of it: PyPI's CUDA build cannot match.
    assert plan(tmp_path, "http://127.0.0.1:9/whl/cpu") == "torch: cpu-local torch==2.13.0+cpu"


def test_a_gpu_machine_gets_the_default_build(tmp_path):
    assert plan(tmp_path, "http://127.0.0.1:9/whl/cpu", gpu=True) == "torch: gpu torch>=2.4"
