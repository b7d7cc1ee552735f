"""Helpers for tests/test_browser.py: Debian's chromium driven by Playwright, a static file server
for the HTML reports, and JupyterLab started headless on 127.0.0.1 in throwaway directories.

Nothing here downloads a browser: the tests use the system chromium (``apt-get install chromium``)
and skip when there is none.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

CHROMIUM_ARGS = [
    "--no-sandbox",  # the machine runs as root
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    # without these Chromium keeps trying to reach Google's services on a closed network
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def find_chromium() -> str | None:
    """Debian's chromium, or whatever ``chromium`` is on PATH; None when there is none."""
    if os.access("/usr/bin/chromium", os.X_OK):
        return "/usr/bin/chromium"
    return shutil.which("chromium")


def launch(playwright, executable: str, user_data_dir: Path, **options):
    """A headless chromium with a fresh profile in ``user_data_dir`` (a persistent context is the
    only way Playwright takes a user data dir). Close it with ``context.close()``."""
    user_data_dir.mkdir(parents=True, exist_ok=True)
    return playwright.chromium.launch_persistent_context(
        str(user_data_dir), executable_path=executable, args=CHROMIUM_ARGS, headless=True,
        viewport={"width": 1400, "height": 1000}, **options,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- what a page says ----------------------------------------------------------------------------
@dataclass
class PageLog:
    """Console errors and uncaught page errors of one page, minus the ones ``ignore`` accepts
    (each accepted one is kept in ``ignored`` so a test can show what it let through)."""

    ignore: Callable[[object], bool] = lambda msg: False
    errors: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)

    def attach(self, page) -> "PageLog":
        page.on("console", self._console)
        page.on("pageerror", lambda exc: self.errors.append(f"pageerror: {exc}"))
        page.on("crash", lambda _page: self.errors.append("the page crashed"))
        return self

    def _console(self, msg) -> None:
        if msg.type != "error":
            return
        where = msg.location.get("url", "") if msg.location else ""
        line = f"console.error: {msg.text} (at {where})"
        (self.ignored if self.ignore(msg) else self.errors).append(line)


def block_other_origins(page, origin: str, blocked: list[str]) -> None:
    """Abort every request that does not go to ``origin`` and note its URL in ``blocked``: the test
    machine has no network, and what a page would fetch from elsewhere is then known exactly."""

    def handle(route) -> None:
        url = route.request.url
        if url.startswith(origin + "/") or url == origin or url.startswith(("data:", "blob:")):
            route.continue_()
        else:
            blocked.append(url)
            route.abort()

    page.route("**/*", handle)


# -- a folder over HTTP --------------------------------------------------------------------------
class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        pass

    def do_GET(self):
        if self.path.split("?")[0] == "/favicon.ico":  # asked for by the browser itself, not the page
            self.send_response(204)
            self.end_headers()
            return
        super().do_GET()


@contextmanager
def serve_directory(directory: Path) -> Iterator[str]:
    """``http://127.0.0.1:<free port>`` serving ``directory`` from a thread, shut down on exit."""
    handler = functools.partial(_QuietHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="report-http", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


# -- JupyterLab ----------------------------------------------------------------------------------
@dataclass
class Lab:
    base: str
    token: str
    root: Path
    log: Path

    def url(self, path: str) -> str:
        return f"{self.base}{path}{'&' if '?' in path else '?'}token={self.token}"

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


#: User settings for a test JupyterLab: no autosave (the open notebook is changed by running it and
#: must not be written back), no news / update checks (requests to the internet, a pop-up over the
#: page), every cell in the DOM (no windowing: cells below the fold can be found and checked).
LAB_SETTINGS = {
    "@jupyterlab/docmanager-extension/plugin": {"autosave": False},
    "@jupyterlab/apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
    "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
}


@contextmanager
def jupyterlab(root: Path, home: Path, *, token: str = "recon-browser-test", timeout: float = 120) -> Iterator[Lab]:
    """JupyterLab serving ``root`` on 127.0.0.1 (a free port), with its config, runtime, data,
    settings and workspaces in ``home``; the app is exposed as ``window.jupyterapp`` so tests can
    wait on the kernel's real state. Terminated (then killed) on exit, its kernels with it."""
    home.mkdir(parents=True, exist_ok=True)
    settings = home / "settings"
    for plugin, values in LAB_SETTINGS.items():
        path = settings / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    env = {
        **os.environ,
        "JUPYTER_CONFIG_DIR": str(home / "config"),
        "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
        "JUPYTER_DATA_DIR": str(home / "data"),  # the notebook trust database goes here, not to ~
        "IPYTHONDIR": str(home / "ipython"),
    }
    port = free_port()
    log = home / "jupyterlab.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
             f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}", "--allow-root",
             "--LabApp.extension_manager=readonly", "--LabApp.expose_app_in_browser=True",
             f"--LabApp.user_settings_dir={settings}", f"--LabApp.workspaces_dir={home / 'workspaces'}"],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=root,
            start_new_session=True,  # its own process group: the kernels can be killed with it
        )
    lab = Lab(f"http://127.0.0.1:{port}", token, root, log)
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"JupyterLab exited with {proc.returncode}:\n{lab.log_tail()}")
            try:
                request = urllib.request.Request(lab.base + "/api/status", headers={"Authorization": f"token {token}"})
                with urllib.request.urlopen(request, timeout=10) as reply:
                    if reply.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"JupyterLab did not answer within {timeout:.0f} s:\n{lab.log_tail()}")
            time.sleep(0.5)
        yield lab
    finally:
        proc.terminate()  # SIGTERM: jupyter_server shuts its kernels down, then exits
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the group started above: JupyterLab and its kernels
            proc.wait(timeout=10)
