"""Widgets driven headlessly: set a control's value as a user would, assert on what it shows."""

from __future__ import annotations

import pytest

from recon import specials, views
from recon.audit import audit_records
from recon.audit.profiles import load_profile
from recon.samples.records import read_records
from recon.notebook.widgets import SampleBrowser, SpecialExplorer, TokenInspector

from .conftest import ROOT


def test_token_inspector_splits_text_and_compares_tokenizers(tokenizers):
    inspector = TokenInspector({"smollm2": tokenizers["smollm2"], "qwen3.6": tokenizers["qwen3.6"]})
    inspector.text.value = "Hi<|im_end|>"
    assert "<h4>smollm2: 2 tokens</h4>" in inspector.output.value and "<h4>qwen3.6: 2 tokens</h4>" in inspector.output.value
    assert 'data-id="2"' in inspector.output.value and 'data-id="248046"' in inspector.output.value
    assert "<td>&lt;|im_end|&gt;</td>" in inspector.table.value
    inspector.allow_special.value = False  # the same text as ordinary text
    assert "<h4>smollm2: 2 tokens</h4>" not in inspector.output.value and 'data-id="2"' not in inspector.output.value
    inspector.right.value = "(none)"
    assert "qwen3.6" not in inspector.output.value


def test_token_inspector_shows_non_canonical_ids_against_the_canonical_encoding(tokenizers):
    tok = tokenizers["smollm2"]
    inspector = TokenInspector({"smollm2": tok})
    jets = tok.encode(" jets")
    split = [tok.piece_to_id("Ġj"), tok.piece_to_id("ets")]
    assert len(jets) == 1 and None not in split
    inspector.ids.value = ", ".join(map(str, split))
    assert "does not round-trip: first difference at position 0" in inspector.output.value
    inspector.ids.value = str(jets[0])
    assert "round-trips: the canonical encoding is the same ids" in inspector.output.value
    inspector.ids.value = "12, x"
    assert "ids: &#x27;x&#x27; is not an integer id" in inspector.output.value or "'x' is not an integer id" in inspector.output.value


@pytest.fixture(scope="module")
def audited(tokenizers):
    tok = tokenizers["smollm2"]
    records = read_records([ROOT / "data" / "smollm2-t0.7.jsonl", ROOT / "data" / "smollm2-t1.3.jsonl"]).records
    rows = audit_records(records, load_profile("chatml").bind(tok), "concat", keep_ids=True)
    return tok, records, rows


def test_sample_browser_filters_and_steps(audited):
    tok, records, rows = audited
    browser = SampleBrowser(tok, records, rows)
    assert browser.count.value == "149 samples"  # opens on mismatches
    browser.dataset.value = "smollm2-t0.7"
    assert browser.count.value == "17 samples"
    browser.cause.value = "invalid_utf8"
    assert browser.count.value == "5 samples"
    browser.region.value = "tool_call"  # chatml output has no calls: nothing there
    assert browser.count.value == "0 samples"
    browser.region.value = "content"
    assert browser.count.value == "5 samples"
    assert "[invalid_utf8]" in browser.output.value and "outline:2px solid" in browser.output.value
    first = browser.output.value
    browser.next.click()
    assert browser.index.value == 1 and browser.output.value != first
    browser.prev.click()
    browser.prev.click()  # stays at the first sample
    assert browser.index.value == 0 and browser.output.value == first
    browser.cause.value = "non_canonical_bpe"
    ids = list(browser.selection["id"])
    browser.index.value = ids.index("p016-0")
    assert "original &#x27; N&#x27;" in browser.output.value or "original ' N'" in browser.output.value
    assert "<td>True</td>" in browser.window.value  # the drill-down marks the differing positions
    browser.status.value = "exact"
    browser.cause.value = "(none)"
    assert browser.count.value == "0 samples"  # exact samples have no divergence, so no region
    browser.region.value = "(none)"
    assert browser.count.value == "143 samples" and "sample p00" in browser.output.value and "exact" in browser.output.value


def test_special_explorer_search_and_failures(kimi):
    explorer = SpecialExplorer(specials.discover(kimi))
    assert explorer.count.value == "23 of 256 added tokens"  # reserved fillers hidden
    explorer.search.value = "im_end"
    assert "<td>163586</td>" in explorer.output.value and explorer.selection["id"].iloc[0] == 163586
    explorer.search.value = ""
    explorer.failures.value = True
    assert explorer.count.value == "0 of 256 added tokens"
    explorer.hide_filled.value = False
    explorer.failures.value = False
    assert explorer.count.value == "256 of 256 added tokens"


def test_views_token_table_and_spans(tokenizers):
    tok = tokenizers["smollm2"]
    ids, table, spans = views.inspect_text(tok, "A 😀<|im_end|>")
    assert table["special"].tolist()[-1] and table["text"].iloc[-1] == "<|im_end|>"
    assert "".join(table["text"]).replace("\ufffd", "") != "" and spans.count('class="recon-token"') == len(ids)
    assert views.parse_ids("[1, 2 3]") == [1, 2, 3]
