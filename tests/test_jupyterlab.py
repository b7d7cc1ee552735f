"""JupyterLab, started headless on 127.0.0.1 by the test: the notebooks are served, the python3
kernel and the widget extension are there."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from .conftest import ROOT

TOKEN = "recon-test-token"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers={"Authorization": f"token {TOKEN}"})
    with urllib.request.urlopen(request, timeout=30) as reply:
        return reply.status, reply.read()


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    port = _free_port()
    home = tmp_path_factory.mktemp("jupyter-home")
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(home / "config"), "JUPYTER_RUNTIME_DIR": str(home / "runtime")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
         f"--IdentityProvider.token={TOKEN}", f"--ServerApp.root_dir={ROOT}", "--allow-root",
         "--LabApp.extension_manager=readonly"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=ROOT,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            if _get(base + "/api/status")[0] == 200:
                break
        except OSError:
            time.sleep(0.5)
    else:
        proc.kill()
        pytest.fail("JupyterLab did not start within 120 s")
    yield base
    proc.terminate()
    proc.wait(timeout=30)


def test_notebooks_are_served(lab):
    status, body = _get(lab + "/api/contents/notebooks")
    names = {item["name"] for item in json.loads(body)["content"]}
    assert {"01_token_discovery.ipynb", "02_roundtrip_audit.ipynb", "03_mismatch_stats.ipynb", "04_explore.ipynb"} <= names
    status, body = _get(lab + "/api/contents/notebooks/04_explore.ipynb")
    cells = json.loads(body)["content"]["cells"]
    assert any("TokenInspector" in c["source"] for c in cells)


def test_lab_page_kernel_and_widget_extension(lab):
    status, body = _get(lab + "/lab/tree/notebooks/04_explore.ipynb")
    assert status == 200 and b"JupyterLab" in body
    kernels = json.loads(_get(lab + "/api/kernelspecs")[1])["kernelspecs"]
    assert "python3" in kernels
    extensions = {e["name"] for e in json.loads(_get(lab + "/lab/api/extensions")[1])}
    assert "@jupyter-widgets/jupyterlab-manager" in extensions
