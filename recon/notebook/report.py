"""Executed reports: params files -> papermill runs of the notebooks -> ``reports/``.

A params file (YAML) names the notebooks to run and their parameters::

    title: SmolLM2-135M-Instruct
    notebooks:
      01_token_discovery:
        tokenizer: smollm2
        expected_ids: {"<|im_end|>": 2}

String values may use ``${VAR}``: a params file for a tokenizer only the user has (Kimi-K2.5)
reads its directory from the environment. A params file for a live engine names its URL under
``engine``; :func:`engine_down` says why it can't be run when nothing answers there. Each run writes ``reports/<params stem>/<notebook>``
as an executed ``.ipynb`` (the immutable run record) and an ``.html`` beside it.

Notebooks publish values for tests and other tools with :func:`record`; :func:`read_records`
reads them back from an executed notebook.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from recon.errors import ReconError

RECORD_MIME = "application/vnd.recon.record+json"
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


class MissingVariable(ReconError):
    """A params file uses ``${VAR}`` and VAR is not set."""


@dataclass
class ParamsFile:
    path: Path
    title: str
    #: notebook name (file stem in notebooks/) -> parameters
    notebooks: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: the base URL of the engine the notebooks collect from (``.../v1``), if they need one
    engine: str | None = None


def load_params(path: str | Path, *, expand: bool = True) -> ParamsFile:
    """Read and check a params file; with ``expand``, resolve ``${VAR}`` from the environment."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ReconError(f"{path}: no such params file") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f", line {mark.line + 1}" if mark else ""
        raise ReconError(f"{path}{where}: not valid YAML ({getattr(e, 'problem', e)})") from None
    if not isinstance(data, dict) or not isinstance(data.get("notebooks"), dict) or not data["notebooks"]:
        raise ReconError(f"{path}: expected a mapping with a non-empty 'notebooks' mapping (notebook -> parameters)")
    notebooks = {}
    for name, params in data["notebooks"].items():
        if params is None:
            params = {}
        if not isinstance(params, dict):
            raise ReconError(f"{path}: notebooks.{name}: expected a mapping of parameter -> value")
        notebooks[str(name)] = _expand(params, path, f"notebooks.{name}") if expand else params
    engine = data.get("engine")
    if engine is not None and not (isinstance(engine, str) and engine.startswith(("http://", "https://"))):
        raise ReconError(f"{path}: engine: expected the engine's base URL (http://host:port/v1)")
    return ParamsFile(path, str(data.get("title") or path.stem), notebooks,
                      _expand(engine, path, "engine") if expand and engine else engine)


def engine_down(url: str, timeout: float = 3.0) -> str | None:
    """Why the engine at ``url`` can't serve a report (None: it answers ``GET {url}/models``)."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url.rstrip("/") + "/models", timeout=timeout) as reply:
            return None if reply.status == 200 else f"{url} answers HTTP {reply.status}"
    except urllib.error.HTTPError as e:
        return f"{url} answers HTTP {e.code}"
    except (urllib.error.URLError, OSError) as e:
        return f"no engine answers at {url} ({getattr(e, 'reason', e)})"


def _expand(value: Any, path: Path, where: str) -> Any:
    if isinstance(value, str):
        def sub(m: re.Match) -> str:
            if m.group(1) not in os.environ:
                raise MissingVariable(f"{path}: {where} uses ${{{m.group(1)}}}, which is not set")
            return os.environ[m.group(1)]
        return _VAR.sub(sub, value)
    if isinstance(value, dict):
        return {k: _expand(v, path, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, list):
        return [_expand(v, path, f"{where}[{i}]") for i, v in enumerate(value)]
    return value


def notebook_parameters(notebook: str | Path) -> dict[str, Any]:
    """The names and defaults papermill sees in a notebook's ``parameters`` cell."""
    import papermill as pm

    return {name: p["default"] for name, p in pm.inspect_notebook(str(notebook)).items()}


@dataclass
class RunResult:
    params: Path
    notebook: str
    output: Path
    html: Path | None
    error: str | None = None


def run_params(
    params: ParamsFile,
    *,
    notebooks_dir: Path = Path("notebooks"),
    out_dir: Path = Path("reports"),
    kernel: str = "python3",
    html: bool = True,
) -> list[RunResult]:
    """Execute every notebook a params file names; a failing notebook is recorded, the rest go on."""
    import papermill as pm

    results = []
    for name, parameters in params.notebooks.items():
        source = notebooks_dir / f"{name}.ipynb"
        if not source.is_file():
            raise ReconError(f"{params.path}: notebooks.{name}: no notebook {source}")
        unknown = sorted(set(parameters) - set(notebook_parameters(source)))
        if unknown:
            raise ReconError(f"{params.path}: notebooks.{name}: {', '.join(unknown)} not in {source}'s parameters cell")
        target_dir = out_dir / params.path.stem
        target_dir.mkdir(parents=True, exist_ok=True)
        output = target_dir / f"{name}.ipynb"
        parameters = {k: _absolute_if_path(v) for k, v in parameters.items()}
        error = None
        try:
            pm.execute_notebook(
                str(source), str(output), parameters=parameters, kernel_name=kernel,
                progress_bar=False, cwd=str(source.parent.resolve()),
                # the kernel's own log stays quiet: its TCP-transport warning, and the "KeyboardInterrupt
                # caught in kernel" it logs as an ERROR when the shutdown's interrupt meets a message
                # handler (seen once in a dozen notebooks); a cell's error still comes back through papermill
                extra_arguments=["--IPKernelApp.log_level=CRITICAL"],
            )
        except pm.PapermillExecutionError as e:
            error = f"{e.ename}: {e.evalue}"
        results.append(RunResult(params.path, name, output, _to_html(output) if html else None, error))
    return results


def _absolute_if_path(value: Any) -> Any:
    """Notebooks run in their own folder (Jupyter's convention); a params value naming an existing
    file or folder relative to where ``recon report`` runs is made absolute so it still resolves."""
    if isinstance(value, list):
        return [_absolute_if_path(v) for v in value]
    if isinstance(value, str) and value and not Path(value).is_absolute() and Path(value).exists():
        return str(Path(value).resolve())
    return value


def _to_html(notebook: Path) -> Path:
    import nbformat
    from nbconvert import HTMLExporter

    node = nbformat.read(str(notebook), as_version=4)
    # the page's <title>: the notebook's first heading (nbconvert would say "Notebook")
    heading = next((line[2:].strip() for cell in node.cells if cell.cell_type == "markdown"
                    for line in cell.source.splitlines() if line.startswith("# ")), notebook.stem)
    body, _ = HTMLExporter().from_notebook_node(node, resources={"metadata": {"name": heading}})
    target = notebook.with_suffix(".html")
    target.write_text(body, encoding="utf-8")
    return target


# -- records --------------------------------------------------------------------------------------
def record(name: str, value: Any) -> None:
    """Publish a JSON value from a notebook under ``name`` (read back with :func:`read_records`)."""
    from IPython.display import display

    display({RECORD_MIME: {"name": name, "value": value}, "text/plain": f"[recorded {name}]"}, raw=True)


def read_records(notebook: str | Path) -> dict[str, Any]:
    """Every value an executed notebook published with :func:`record`."""
    nb = json.loads(Path(notebook).read_text(encoding="utf-8"))
    found = {}
    for cell in nb.get("cells", []):
        for out in cell.get("outputs", []):
            rec = out.get("data", {}).get(RECORD_MIME)
            if rec is not None:
                found[rec["name"]] = rec["value"]
    return found
