"""The notebook layer in a real browser (Debian's chromium, driven by Playwright):

* the HTML reports ``recon report params/smollm2.yaml`` writes, served over http://127.0.0.1:
  headings, the tables the notebooks show, the plots, and no JS errors;
* notebooks/04_explore.ipynb in a headless JupyterLab: run all cells, the three widgets come alive,
  typing into the token inspector shows the tokens of the typed text, and no JS errors.

Every value checked comes from somewhere else than recon's own audit: the tokenizer's native core
(``tokenizers.Tokenizer`` for SmolLM2, ``tiktoken.Encoding`` for Qwen3.6) run on the bundled data,
the params file, the source notebooks. Skipped only when there is no chromium binary.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from .browser_support import PageLog, block_other_origins, find_chromium, jupyterlab, launch, serve_directory
from .conftest import ROOT

PARAMS = ROOT / "params" / "smollm2.yaml"
DATA = [ROOT / "data" / "smollm2-t0.7.jsonl", ROOT / "data" / "smollm2-t1.3.jsonl"]
REPORTS = ["01_token_discovery", "02_roundtrip_audit", "03_mismatch_stats"]
END_TOKEN = "<|im_end|>"
TYPED = "Hello <|im_end|> world"  # typed into the token inspector, key by key
EXPLORE = "notebooks/04_explore.ipynb"
KERNEL_TIMEOUT = 120_000  # ms: kernel start, run all cells, a widget round trip, on a slow machine
PAGE_TIMEOUT = 60_000

#: Requests the nbconvert "lab" template makes to a CDN (require.js and MathJax, loaded by every
#: report). The test machine has no network, so they are aborted; their "Failed to load resource"
#: console errors are the only console errors the report pages may show (see ``report_pages``).
REPORT_CDN = ("https://cdnjs.cloudflare.com/ajax/libs/require.js/", "https://cdnjs.cloudflare.com/ajax/libs/mathjax/")


# -- the browser ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def chromium() -> str:
    path = find_chromium()
    if path is None:
        pytest.skip("no chromium binary (/usr/bin/chromium, or chromium on PATH): apt-get install -y chromium")
    return path


@pytest.fixture(scope="module")
def pw(chromium):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        yield p


# -- the oracle: the native tokenizer cores on the bundled data ---------------------------------------
@dataclass
class Oracle:
    smol: object  # tokenizers.Tokenizer
    qwen: object  # tiktoken.Encoding
    #: dataset -> (samples, exact): exact = decode then encode gives the same ids, by the native core
    counts: dict[str, tuple[int, int]] = field(default_factory=dict)
    #: sample id -> {(first differing position, length)} of its mismatching samples (ids repeat across datasets)
    mismatches: dict[str, set[tuple[int, int]]] = field(default_factory=dict)
    #: dataset -> number of samples whose last id is the end token's
    ended: dict[str, int] = field(default_factory=dict)

    @property
    def end_id(self) -> int:
        return self.smol.token_to_id(END_TOKEN)

    def added(self) -> dict[str, int]:
        return {t.content: i for i, t in self.smol.get_added_tokens_decoder().items()}


@pytest.fixture(scope="module")
def oracle() -> Oracle:
    import recon

    o = Oracle(recon.load_tokenizer("smollm2").core, recon.load_tokenizer("qwen3.6").core)
    for path in DATA:
        samples = exact = ended = 0
        for line in path.read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            ids = record["output_ids"]
            again = o.smol.encode(o.smol.decode(ids, skip_special_tokens=False), add_special_tokens=False).ids
            samples += 1
            ended += ids[-1] == o.end_id
            if again == ids:
                exact += 1
            else:
                first = next((k for k, (a, b) in enumerate(zip(ids, again)) if a != b), min(len(ids), len(again)))
                o.mismatches.setdefault(record["id"], set()).add((first, len(ids)))
            dataset = record.get("dataset", path.stem)
        o.counts[dataset] = (samples, exact)
        o.ended[dataset] = ended
    assert set(o.counts) == {"smollm2-t0.7", "smollm2-t1.3"}
    return o


# -- the HTML reports ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def reports(chromium, tmp_path_factory) -> Path:
    """``recon report params/smollm2.yaml`` into a temporary folder (about 20 s): the executed
    notebooks and their HTML copies."""
    out = tmp_path_factory.mktemp("reports")
    run = subprocess.run(
        [sys.executable, "-m", "recon.cli", "report", str(PARAMS.relative_to(ROOT)), "--out", str(out)],
        capture_output=True, text=True, cwd=ROOT, timeout=900,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    folder = out / "smollm2"
    for name in REPORTS:
        assert (folder / f"{name}.html").is_file(), run.stdout
    return folder


@dataclass
class Report:
    name: str
    page: object
    log: PageLog
    blocked: list[str]

    def tables(self) -> list[dict]:
        return self.page.locator("body").evaluate(TABLES_JS)

    def text(self) -> str:
        return self.page.inner_text("body")


#: Every table under an element: header rows and body rows as cell texts.
TABLES_JS = """(root) => [...root.querySelectorAll('table')].map(t => ({
  visible: t.getBoundingClientRect().width > 0 && t.getBoundingClientRect().height > 0,
  head: t.tHead ? [...t.tHead.rows].map(r => [...r.cells].map(c => c.textContent.trim())) : [],
  body: [...t.tBodies].flatMap(b => [...b.rows]).map(r => [...r.cells].map(c => c.textContent.trim())),
}))"""

HEADINGS_JS = """() => [...document.querySelectorAll('.jp-MarkdownOutput h1, .jp-MarkdownOutput h2')].map(h => {
  const c = h.cloneNode(true);
  c.querySelectorAll('.anchor-link').forEach(a => a.remove());
  return [h.tagName.toLowerCase(), c.textContent.trim()];
})"""

IMAGES_JS = """() => [...document.querySelectorAll('.jp-OutputArea-output img')].map(i => ({
  complete: i.complete, width: i.naturalWidth, height: i.naturalHeight,
  shown: i.getBoundingClientRect().width > 0 && i.getBoundingClientRect().height > 0,
  src: i.getAttribute('src').slice(0, 22),
}))"""


def tables_with(tables: list[dict], *columns: str) -> list[list[dict[str, str]]]:
    """The rendered tables whose first header row has ``columns``, each as rows of header -> cell
    (a row's index cells come first, under the header row's first names)."""
    found = [t for t in tables if t["head"] and set(columns) <= set(t["head"][0])]
    for t in found:
        assert t["visible"], f"a table with columns {columns} is not shown"
    return [[dict(zip(t["head"][0], row)) for row in t["body"]] for t in found]


def table_with(tables: list[dict], *columns: str) -> list[dict[str, str]]:
    """The one rendered table whose first header row has ``columns``."""
    found = tables_with(tables, *columns)
    assert len(found) == 1, f"{len(found)} tables with columns {columns}: {[t['head'] for t in tables]}"
    return found[0]


@pytest.fixture(scope="module")
def report_pages(pw, chromium, reports, tmp_path_factory):
    """Each report opened once over HTTP in one chromium; requests anywhere but the local server are
    aborted and listed."""
    with serve_directory(reports) as base:
        context = launch(pw, chromium, tmp_path_factory.mktemp("chromium-reports"))
        try:
            pages = {}
            for name in REPORTS:
                blocked: list[str] = []
                # The only console errors let through: the aborted CDN scripts of nbconvert's template
                # ("Failed to load resource: net::ERR_FAILED" at exactly such a URL). Anything the
                # page's own scripts raise is a pageerror and still fails the tests.
                log = PageLog(ignore=lambda msg, blocked=blocked: msg.text.startswith("Failed to load resource")
                              and (msg.location or {}).get("url") in blocked)
                page = context.new_page()
                page.set_default_timeout(PAGE_TIMEOUT)
                log.attach(page)
                block_other_origins(page, base, blocked)
                page.goto(f"{base}/{name}.html", wait_until="load")
                page.wait_for_function("() => [...document.images].every(i => i.complete)")
                pages[name] = Report(name, page, log, blocked)
            yield pages
        finally:
            context.close()


def assert_no_errors(log: PageLog) -> None:
    errors = list(log.errors)
    assert not errors, "JS errors in the page:\n" + "\n".join(errors)


def source_headings(name: str) -> list[list[str]]:
    """The ``#`` and ``##`` headings of a source notebook's markdown cells, as they read rendered."""
    nb = json.loads((ROOT / "notebooks" / f"{name}.ipynb").read_text(encoding="utf-8"))
    out = []
    for cell in nb["cells"]:
        if cell["cell_type"] != "markdown":
            continue
        for line in "".join(cell["source"]).splitlines():
            if m := re.match(r"^(#{1,2}) (.+)$", line):
                out.append([f"h{len(m.group(1))}", m.group(2).replace("`", "").strip()])
    return out


@pytest.mark.parametrize("name", REPORTS)
def test_report_renders_headings_plots_and_no_errors(report_pages, reports, name):
    report = report_pages[name]
    page = report.page
    # every heading of the source notebook, in order; the first is the report's title
    headings = page.evaluate(HEADINGS_JS)
    expected = source_headings(name)
    assert headings == expected
    first = next(line[2:] for cell in json.loads((ROOT / "notebooks" / f"{name}.ipynb").read_text(encoding="utf-8"))["cells"]
                 if cell["cell_type"] == "markdown" for line in "".join(cell["source"]).splitlines() if line.startswith("# "))
    assert page.title() == first.strip()  # the tab shows the notebook's own title, not nbconvert's "Notebook"
    assert headings[0][0] == "h1" and page.locator("h1").first.is_visible()
    # every plot the executed notebook holds is an <img> that decoded to a real picture and is shown
    executed = json.loads((reports / f"{name}.ipynb").read_text(encoding="utf-8"))
    plots = sum("image/png" in out.get("data", {}) for cell in executed["cells"] for out in cell.get("outputs", []))
    images = page.evaluate(IMAGES_JS)
    assert plots >= 2 and len(images) == plots, images
    for image in images:
        assert image["complete"] and image["width"] > 0 and image["height"] > 0 and image["shown"], image
        assert image["src"] == "data:image/png;base64,"
    # the notebook ran through: no traceback anywhere
    text = report.text()
    assert "Traceback (most recent call last)" not in text and "An Exception was encountered" not in text
    # nothing but the template's CDN scripts was asked of another origin; no JS error at all
    assert all(url.startswith(REPORT_CDN) for url in report.blocked), report.blocked
    assert_no_errors(report.log)


def test_discovery_report_special_token_tables(report_pages, oracle):
    report = report_pages["01_token_discovery"]
    tables = report.tables()
    added = table_with(tables, "id", "content", "special", "roles", "config_check", "roundtrip", "plain_ids")
    # every added token of the native core, at the core's id; <|im_end|> at 2 for SmolLM2
    assert {row["content"]: int(row["id"]) for row in added} == oracle.added()
    assert oracle.added()[END_TOKEN] == 2
    im_end = next(row for row in added if row["content"] == END_TOKEN)
    assert (im_end["id"], im_end["special"], im_end["roundtrip"]) == ("2", "True", "True")
    # the ids the params file expects, next to the core's own ids
    expected = yaml.safe_load(PARAMS.read_text())["notebooks"]["01_token_discovery"]["expected_ids"]
    checked = table_with(tables, "content", "expected_id", "actual_id", "ok")
    assert {row["content"]: (int(row["expected_id"]), int(row["actual_id"]), row["ok"]) for row in checked} == {
        text: (i, oracle.smol.token_to_id(text), "True") for text, i in expected.items()
    }
    # the empirical check: how many samples really end with <|im_end|>, counted on the raw ids
    samples, _ = oracle.counts["smollm2-t0.7"]
    ended = oracle.ended["smollm2-t0.7"]
    text = report.text()
    assert f"{ended}/{samples} samples ({100 * ended / samples:.1f}%) end with '{END_TOKEN}' ({oracle.end_id})" in text
    last = table_with(tables, "id", "piece", "count", "share")
    assert (last[0]["id"], last[0]["piece"], int(last[0]["count"])) == (str(oracle.end_id), END_TOKEN, ended)
    assert "PASS\n" in text and f"expected ids: {len(expected)}/{len(expected)} match" in text
    assert_no_errors(report.log)


def status_rows(report: Report) -> dict[str, tuple[int, int, float]]:
    rows = table_with(report.tables(), "exact", "mismatch", "exact_rate")
    return {row["status"]: (int(row["exact"]), int(row["mismatch"]), float(row["exact_rate"])) for row in rows}


def expected_status(oracle: Oracle, datasets: list[str]) -> dict[str, tuple[int, int]]:
    out = {d: (oracle.counts[d][1], oracle.counts[d][0] - oracle.counts[d][1]) for d in datasets}
    out["all"] = (sum(e for e, _ in out.values()), sum(m for _, m in out.values()))
    return out


def test_audit_report_exact_and_mismatch_counts(report_pages, oracle):
    report = report_pages["02_roundtrip_audit"]
    shown = status_rows(report)
    expected = expected_status(oracle, ["smollm2-t1.3"])  # the dataset params/smollm2.yaml audits
    assert {k: v[:2] for k, v in shown.items()} == expected
    for exact, mismatch, rate in shown.values():
        assert rate == pytest.approx(exact / (exact + mismatch), abs=5e-4)
    samples, exact = oracle.counts["smollm2-t1.3"]
    assert f"plain decode->encode exact: {exact}/{samples}; audit in roundtrip mode: {exact}/{samples}" in report.text()
    # the drill-down names a mismatching sample at the position the native core puts its first difference
    described = re.search(r"sample (\S+) differs at position (\d+) of (\d+)", report.text())
    assert described, "no drill-down line"
    assert (int(described[2]), int(described[3])) in oracle.mismatches[described[1]]
    assert_no_errors(report.log)


def test_stats_report_exact_and_mismatch_counts(report_pages, oracle):
    report = report_pages["03_mismatch_stats"]
    shown = status_rows(report)
    assert {k: v[:2] for k, v in shown.items()} == expected_status(oracle, ["smollm2-t0.7", "smollm2-t1.3"])
    assert shown["all"][:2] == (171, 149)  # the numbers docs/audit.md and tests/test_notebooks.py quote
    for exact, mismatch, rate in shown.values():
        assert rate == pytest.approx(exact / (exact + mismatch), abs=5e-4)
    # the first-cause table (the first one by cause) gives every mismatching sample one cause, per dataset
    causes = tables_with(report.tables(), "cause", "non_canonical_bpe")[0]
    firsts = {row["cause"]: sum(int(v or 0) for k, v in row.items() if k != "cause") for row in causes}
    assert firsts == {d: samples - exact for d, (samples, exact) in oracle.counts.items()}
    assert_no_errors(report.log)


# -- JupyterLab ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def lab(chromium, tmp_path_factory):
    """JupyterLab on 127.0.0.1 serving a copy of 04_explore.ipynb (running it in the browser changes
    it; the repository's copy is never served, and autosave is off anyway) with data/ linked beside
    it, so the notebook's ``../data`` paths resolve."""
    home = tmp_path_factory.mktemp("jupyterlab")
    root = home / "root"
    (root / "notebooks").mkdir(parents=True)
    shutil.copy2(ROOT / EXPLORE, root / EXPLORE)
    (root / "data").symlink_to(ROOT / "data", target_is_directory=True)
    with jupyterlab(root, home / "jupyter") as server:
        yield server


#: The open notebook's kernel, as JupyterLab itself sees it (``window.jupyterapp``).
KERNEL_JS = """(path) => {
  const app = window.jupyterapp;
  const panel = app && app.shell.currentWidget;
  if (!panel || !panel.context || panel.context.path !== path) return null;
  const kernel = panel.sessionContext && panel.sessionContext.session && panel.sessionContext.session.kernel;
  return kernel ? {connection: kernel.connectionStatus, status: kernel.status} : null;
}"""

#: The code cell whose source contains ``marker``.
CELL_JS = """(marker) => [...document.querySelectorAll('.jp-Notebook .jp-CodeCell')]
  .find(c => c.querySelector('.jp-InputArea-editor').textContent.includes(marker))"""

WIDGET_CELLS = {"inspector": "TokenInspector(toks", "browser": "SampleBrowser(tok", "explorer": "SpecialExplorer("}

#: Done running all cells: the kernel idle, every prompt numbered, and each widget cell showing a
#: live widget (the saved outputs only hold a text fallback: a widget view proves the cell ran now).
RAN_ALL_JS = f"""([path, markers]) => {{
  const k = ({KERNEL_JS})(path);
  if (!k || k.connection !== 'connected' || k.status !== 'idle') return false;
  const prompts = [...document.querySelectorAll('.jp-Notebook .jp-CodeCell .jp-InputArea-prompt')].map(p => p.textContent.trim());
  if (!prompts.length || !prompts.every(p => /^\\[\\d+\\]:$/.test(p))) return false;
  return markers.every(m => {{ const c = ({CELL_JS})(m); return c && c.querySelector('.jp-OutputArea-output .widget-vbox'); }});
}}"""

#: What the token inspector shows: per column its heading and token spans, and the token table.
INSPECTOR_JS = f"""(marker) => {{
  const cell = ({CELL_JS})(marker);
  if (!cell) return null;
  const columns = [...cell.querySelectorAll('.recon-spans')].map(s => ({{
    heading: s.parentElement.querySelector('h4') ? s.parentElement.querySelector('h4').textContent.trim() : null,
    spans: [...s.querySelectorAll('.recon-token')].map(t => ({{
      id: Number(t.dataset.id), text: t.textContent, title: t.getAttribute('title'),
      bold: Number(getComputedStyle(t).fontWeight) >= 600, shown: t.getBoundingClientRect().width > 0,
    }})),
  }}));
  const table = cell.querySelector('table.dataframe');
  return {{
    columns,
    head: table ? [...table.tHead.rows[0].cells].map(c => c.textContent.trim()) : [],
    rows: table ? [...table.tBodies[0].rows].map(r => [...r.cells].map(c => c.textContent)) : [],
  }};
}}"""


@dataclass
class Explore:
    page: object
    log: PageLog
    blocked: list[str]
    prompts: list[str]
    shots: Path
    source: Path  # the notebook file JupyterLab serves

    @property
    def source_cells(self) -> int:
        return len(json.loads(self.source.read_text(encoding="utf-8"))["cells"])

    def cell(self, key: str):
        marker = WIDGET_CELLS[key]
        return self.page.locator(".jp-Notebook .jp-CodeCell").filter(
            has=self.page.locator(".jp-InputArea-editor", has_text=marker))

    def html_texts(self, key: str) -> list[str]:
        return [t.strip() for t in self.cell(key).locator(".widget-html-content").all_inner_texts()]

    def assert_clean(self) -> None:
        assert_no_errors(self.log)
        assert not self.blocked, f"JupyterLab asked other origins for {self.blocked}"


@pytest.fixture(scope="module")
def explore(pw, chromium, lab, tmp_path_factory):
    """04_explore.ipynb open in JupyterLab with all cells run (Run > Run All Cells, by mouse)."""
    shots = tmp_path_factory.mktemp("screenshots")
    context = launch(pw, chromium, tmp_path_factory.mktemp("chromium-lab"))
    try:
        page = context.pages[0] if context.pages else context.new_page()
        page.set_default_timeout(PAGE_TIMEOUT)
        blocked: list[str] = []
        log = PageLog().attach(page)  # JupyterLab must run without a single console error: nothing ignored
        block_other_origins(page, lab.base, blocked)
        try:
            page.goto(lab.url(f"/lab/tree/{EXPLORE}"), wait_until="domcontentloaded")
            page.wait_for_selector(".jp-Notebook .jp-CodeCell", timeout=KERNEL_TIMEOUT)
            # wait until JupyterLab has the kernel connected and idle; running before asks for a kernel
            page.wait_for_function(
                f"(path) => {{ const k = ({KERNEL_JS})(path); return !!k && k.connection === 'connected' && k.status === 'idle'; }}",
                arg=EXPLORE, timeout=KERNEL_TIMEOUT)
            page.locator(".lm-MenuBar-item", has_text=re.compile(r"^Run$")).click()
            page.locator("li.lm-Menu-item[data-command='runmenu:run-all']").click()
            page.wait_for_function(RAN_ALL_JS, arg=[EXPLORE, list(WIDGET_CELLS.values())], timeout=KERNEL_TIMEOUT)
            prompts = page.locator(".jp-Notebook .jp-CodeCell .jp-InputArea-prompt").all_inner_texts()
        except Exception as e:
            shot = shots / "explore-failed.png"
            page.screenshot(path=str(shot))
            raise AssertionError(f"running {EXPLORE} in JupyterLab failed ({e}); screenshot {shot}; "
                                 f"console errors {log.errors}; JupyterLab log:\n{lab.log_tail()}") from e
        yield Explore(page, log, blocked, [p.strip() for p in prompts], shots, lab.root / EXPLORE)
    finally:
        context.close()


def test_run_all_cells_brings_the_widgets_alive(explore, oracle):
    page = explore.page
    # a fresh kernel ran every code cell once, in order
    assert explore.prompts == [f"[{k}]:" for k in range(1, len(explore.prompts) + 1)], explore.prompts
    assert page.locator(".jp-Notebook .jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']").count() == 0
    assert page.locator(".jp-Notebook .jp-OutputArea-output", has_text="Traceback").count() == 0
    for key in WIDGET_CELLS:
        assert explore.cell(key).locator(".widget-vbox").first.is_visible(), key
    # the sample browser starts on the mismatches: as many as the native core finds
    mismatched = sum(samples - exact for samples, exact in oracle.counts.values())
    assert f"{mismatched} samples" in explore.html_texts("browser")
    # the special-token explorer lists every added token
    n = len(oracle.added())
    assert f"{n} of {n} added tokens" in explore.html_texts("explorer")
    explore.assert_clean()


def test_typing_into_the_token_inspector_shows_its_tokens(explore, oracle):
    page = explore.page
    box = explore.cell("inspector").locator(".widget-textarea textarea")
    box.click()
    page.keyboard.press("Control+A")
    page.keyboard.press("Backspace")
    page.wait_for_function("(el) => el.value === ''", arg=box.element_handle())
    page.keyboard.type(TYPED, delay=25)
    assert box.input_value() == TYPED
    assert page.evaluate("() => document.activeElement && document.activeElement.tagName") == "TEXTAREA"

    smol = oracle.smol.encode(TYPED, add_special_tokens=False)
    qwen_ids = oracle.qwen.encode(TYPED, allowed_special="all")
    try:
        page.wait_for_function(
            f"(expected) => {{ const r = ({INSPECTOR_JS})({json.dumps(WIDGET_CELLS['inspector'])});"
            " return !!r && JSON.stringify(r.columns.map(c => c.spans.map(s => s.id))) === JSON.stringify(expected); }",
            arg=[smol.ids, qwen_ids], timeout=KERNEL_TIMEOUT)
    except Exception:
        page.screenshot(path=str(explore.shots / "inspector.png"))
        raise
    shown = page.evaluate(INSPECTOR_JS, WIDGET_CELLS["inspector"])
    page.screenshot(path=str(explore.shots / "inspector.png"))
    assert box.input_value() == TYPED  # no late echo from the kernel overwrote what was typed

    special = {i for i, t in oracle.smol.get_added_tokens_decoder().items() if t.special}
    left, right = shown["columns"]
    assert left["heading"] == f"smollm2: {len(smol.ids)} tokens"
    assert [s["id"] for s in left["spans"]] == smol.ids
    for k, (span, i, piece) in enumerate(zip(left["spans"], smol.ids, smol.tokens)):
        assert span["text"] == oracle.smol.decode([i], skip_special_tokens=False).replace(" ", "␣")
        assert span["title"] == f"#{k} id {i} {piece!r}"
        assert span["shown"] and span["bold"] == (i in special), span
    # <|im_end|> is one token, the special id 2, shown as such (the dark bold span)
    ends = [s for s in left["spans"] if s["text"] == END_TOKEN]
    assert len(ends) == 1 and ends[0]["id"] == oracle.end_id == 2 and ends[0]["bold"]
    assert sum(s["bold"] for s in left["spans"]) == 1
    # the token table of the first tokenizer: position, id, piece, text, bytes, special
    assert shown["head"] == ["pos", "id", "piece", "text", "bytes", "special"]
    rows = [(int(r[0]), int(r[1]), r[2], r[3].strip(), r[4], r[5]) for r in shown["rows"]]
    assert rows == [
        (k, i, piece, oracle.smol.decode([i], skip_special_tokens=False).strip(),
         oracle.smol.decode([i], skip_special_tokens=False).encode("utf-8").hex(" "), str(i in special))
        for k, (i, piece) in enumerate(zip(smol.ids, smol.tokens))
    ]
    # the second column: Qwen3.6 by its tiktoken core
    assert right["heading"] == f"qwen3.6: {len(qwen_ids)} tokens"
    assert [s["id"] for s in right["spans"]] == qwen_ids
    assert [s["text"] for s in right["spans"]] == [
        oracle.qwen.decode_single_token_bytes(i).decode("utf-8").replace(" ", "␣") for i in qwen_ids]
    assert [s["bold"] for s in right["spans"]] == [t == END_TOKEN for t in (s["text"] for s in right["spans"])]
    # the keys went to the text box only: no notebook shortcut fired (cells added, cut, changed)
    assert page.locator(".jp-Notebook .jp-Cell").count() == explore.source_cells
    explore.assert_clean()


def test_sample_browser_steps_through_mismatches(explore, oracle):
    page = explore.page
    cell = explore.cell("browser")
    described = re.compile(r"sample (\S+) differs at position (\d+) of (\d+)")

    def current() -> tuple[str, int, int]:
        line = cell.locator(".widget-html-content b", has_text=described).first.inner_text()
        m = described.search(line)
        return m[1], int(m[2]), int(m[3])

    first = current()
    assert (first[1], first[2]) in oracle.mismatches[first[0]]
    cell.locator("button", has_text="next").click()
    page.wait_for_function("(el) => el.value === '1'", arg=cell.locator("input[type=number]").element_handle(),
                           timeout=KERNEL_TIMEOUT)
    page.wait_for_function(
        "([el, before]) => !!el && !el.innerText.includes(before)",
        arg=[cell.locator(".widget-html-content", has_text=described).first.element_handle(),
             f"sample {first[0]} differs at position {first[1]} of {first[2]}"],
        timeout=KERNEL_TIMEOUT)
    second = current()
    assert second != first and (second[1], second[2]) in oracle.mismatches[second[0]]
    explore.assert_clean()


def test_special_explorer_search(explore, oracle):
    page = explore.page
    cell = explore.cell("explorer")
    search = cell.locator(".widget-text input[type=text]")
    search.click()
    page.keyboard.type("im_end", delay=25)
    assert search.input_value() == "im_end"
    page.wait_for_function(
        f"() => {{ const c = ({CELL_JS})({json.dumps(WIDGET_CELLS['explorer'])});"
        " const t = c && c.querySelector('table.dataframe'); if (!t) return false;"
        " const head = [...t.tHead.rows[0].cells].map(x => x.textContent.trim());"
        " const row = t.tBodies[0].rows[0]; return head[0] === 'score' && !!row &&"
        f" row.cells[head.indexOf('content')].textContent.trim() === {json.dumps(END_TOKEN)}; }}",
        timeout=KERNEL_TIMEOUT)
    found = table_with(cell.evaluate(TABLES_JS), "score", "id", "content")
    assert (found[0]["content"], int(found[0]["id"])) == (END_TOKEN, oracle.end_id)
    explore.assert_clean()
