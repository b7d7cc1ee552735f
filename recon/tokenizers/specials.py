"""Special-token discovery: every added token's id, text and round-trip, checked, never assumed.

Wrong special-token ids are silent: Kimi-K2.5's ``<|im_end|>`` is 163586, yet a pipeline ran
for weeks on 163533, an ordinary token ("chas"). So recon looks every special token up by its
text, checks that ``decode([id]) == text`` and ``encode(text) == [id]``, compares the loaded id
with what the config declares, and compares both with the ids a user expects. Given real
output_ids, it also checks empirically which token really ends the samples.
"""

from __future__ import annotations

import difflib
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

import pandas as pd

from recon.errors import SpecialTokenMismatch
from recon.tokenizers.tokenizer import Tokenizer

COLUMNS = [
    "id", "content", "special", "roles", "declared", "config_id", "config_check",
    "decoded", "encoded", "decode_roundtrip", "encode_roundtrip", "roundtrip", "plain_ids",
]


def discover(tok: Tokenizer) -> pd.DataFrame:
    """One row per added token (and per declared token the tokenizer lacks), sorted by id.

    ``config_check`` is ``match`` (loaded at the declared id), ``mismatch`` (declared at
    ``config_id``, loaded elsewhere), ``missing`` (declared, not in the tokenizer), ``filled``
    (an undeclared id recon filled with a reserved token), or ``undeclared`` (the file is its
    own declaration: GGUF, or a tokenizer.json without an ``added_tokens_decoder``).
    ``plain_ids`` is how the token's text encodes as ordinary text.
    """
    declared_by_content = {t.content: t.id for t in tok.declared.values()}
    roles: dict[str, list[str]] = {}
    for role, content in tok.roles.items():
        roles.setdefault(content, []).append(role)
    tokens = list(tok.added_tokens)
    contents = [t.content for t in tokens]
    decoded = tok.decode_batch([[t.id] for t in tokens])
    encoded = tok.encode_batch(contents)
    plain = tok.encode_batch(contents, allow_special=False)
    rows = []
    for t, dec, enc, pl in zip(tokens, decoded, encoded, plain):
        config_id = declared_by_content.get(t.content)
        if not t.declared:
            check = "filled"
        elif config_id is None:
            check = "undeclared" if not tok.declared else "not_in_config"
        else:
            check = "match" if config_id == t.id else "mismatch"
        rows.append(
            dict(
                id=t.id, content=t.content, special=t.special, roles=",".join(roles.get(t.content, [])),
                declared=t.declared, config_id=config_id, config_check=check, decoded=dec, encoded=enc,
                decode_roundtrip=dec == t.content, encode_roundtrip=enc == [t.id],
                roundtrip=dec == t.content and enc == [t.id], plain_ids=pl,
            )
        )
    loaded = set(contents)
    for token_id, t in tok.declared.items():
        if t.content not in loaded:
            rows.append(
                dict(
                    id=token_id, content=t.content, special=t.special, roles=",".join(roles.get(t.content, [])),
                    declared=True, config_id=token_id, config_check="missing", decoded=None, encoded=None,
                    decode_roundtrip=False, encode_roundtrip=False, roundtrip=False,
                    plain_ids=tok.encode(t.content, allow_special=False),
                )
            )
    table = pd.DataFrame(rows, columns=COLUMNS)
    table["config_id"] = table["config_id"].astype("Int64")
    return table.sort_values("id", kind="stable").reset_index(drop=True)


# -- name queries ---------------------------------------------------------------------------------
def _normalize(text: str) -> str:
    for ch in "<>|｜[]":
        text = text.replace(ch, "")
    return text.replace("▁", "_").replace(" ", "_").strip("_").lower()


def _words(name: str) -> list[str]:
    return [w for w in name.replace("/", "_/_").split("_") if w]


def _is_subsequence(needle: list[str], hay: list[str]) -> bool:
    it = iter(hay)
    return all(any(w == h for h in it) for w in needle)


def _score(query: str, content: str) -> tuple[float, str]:
    if query == content:
        return 1.0, "exact"
    q, c = _normalize(query), _normalize(content)
    if not q or not c:
        return 0.0, ""
    if q == c:
        return 0.9, "same name"
    if _is_subsequence(_words(q), _words(c)):
        return 0.5 + 0.3 * len(q) / len(c), "same words"
    if q in c:
        return 0.3 + 0.1 * len(q) / len(c), "contains"
    ratio = difflib.SequenceMatcher(None, q, c).ratio()
    return (0.3 * ratio, "similar") if ratio >= 0.6 else (0.0, "")


def find(table: pd.DataFrame, query: str, limit: int = 10) -> pd.DataFrame:
    """Rows of a :func:`discover` table whose text matches ``query``, best first.

    ``query`` may be the exact text (``</think>``) or a name (``im_end``, ``tool_call``,
    ``end of sentence``); scores: 1.0 exact, 0.9 same name ignoring brackets/case/``▁``,
    0.5-0.8 holds the query's words in order, 0.3-0.4 holds it as a substring, below 0.3 similar.
    """
    scored = [(*_score(query, c), i) for i, c in enumerate(table["content"])]
    hits = sorted((s for s in scored if s[0] > 0), key=lambda s: (-s[0], table["id"].iloc[s[2]]))[:limit]
    out = table.iloc[[i for _, _, i in hits]].copy()
    out.insert(0, "score", [round(s, 3) for s, _, _ in hits])
    out.insert(1, "match", [m for _, m, _ in hits])
    out.insert(2, "query", query)
    return out.reset_index(drop=True)


# -- expected ids ---------------------------------------------------------------------------------
def check_expected(tok: Tokenizer, expected: Mapping[str, int]) -> pd.DataFrame:
    """Each expected ``text -> id`` against the tokenizer: one row each, ``ok`` True or False."""
    rows = []
    for content, want in expected.items():
        added = tok.added_by_content.get(content)
        actual = added.id if added is not None else None
        want = int(want)
        holds_token = 0 <= want < tok.vocab_size and want not in tok.gap_ids
        at_expected = tok.decode([want]) if holds_token else None
        rows.append(
            dict(content=content, expected_id=want, actual_id=actual, text_at_expected_id=at_expected, ok=actual == want)
        )
    table = pd.DataFrame(rows, columns=["content", "expected_id", "actual_id", "text_at_expected_id", "ok"])
    table["actual_id"] = table["actual_id"].astype("Int64")
    return table


def assert_expected(tok: Tokenizer, expected: Mapping[str, int]) -> pd.DataFrame:
    """:func:`check_expected`, raising :class:`SpecialTokenMismatch` naming every mismatch."""
    checked = check_expected(tok, expected)
    bad = checked[~checked["ok"]]
    if len(bad):
        problems = []
        for r in bad.itertuples():
            where = "the tokenizer has no such added token" if pd.isna(r.actual_id) else f"the tokenizer has it at {r.actual_id}"
            found = f"; id {r.expected_id} is {r.text_at_expected_id!r}" if r.text_at_expected_id is not None else ""
            problems.append(f"{r.content!r}: expected id {r.expected_id}, but {where}{found}")
        raise SpecialTokenMismatch(f"{tok.name}: " + "; ".join(problems))
    return checked


# -- empirical check on real output_ids -------------------------------------------------------------
def last_token_histogram(tok: Tokenizer, output_ids: Iterable[Sequence[int]]) -> pd.DataFrame:
    """How often each token ends a sample (empty samples counted under id -1)."""
    counts = Counter(ids[-1] if len(ids) else -1 for ids in output_ids)
    total = sum(counts.values())
    rows = [
        dict(id=i, piece=tok.id_to_piece(i) if i >= 0 else "(empty)", count=n, share=n / total if total else 0.0)
        for i, n in counts.most_common()
    ]
    return pd.DataFrame(rows, columns=["id", "piece", "count", "share"])


@dataclass
class EndTokenCheck:
    """Is the configured end token really the one that ends the samples?"""

    end_text: str
    end_id: int | None
    samples: int
    ending_with_end: int
    histogram: pd.DataFrame = field(repr=False)

    @property
    def share(self) -> float:
        return self.ending_with_end / self.samples if self.samples else 0.0

    @property
    def ok(self) -> bool:
        """True when the configured end token is the most common last token."""
        return self.end_id is not None and len(self.histogram) > 0 and int(self.histogram["id"].iloc[0]) == self.end_id

    def message(self) -> str:
        if self.end_id is None:
            return f"{self.end_text!r} is not an added token of this tokenizer"
        top = self.histogram.iloc[0] if len(self.histogram) else None
        head = f"{self.ending_with_end}/{self.samples} samples ({self.share:.1%}) end with {self.end_text!r} ({self.end_id})"
        if top is None or self.ok:
            return head
        return f"{head}; the most common last token is {top['piece']!r} ({top['id']}), {top['count']} samples"


def check_end_token(tok: Tokenizer, output_ids: Sequence[Sequence[int]], end_text: str) -> EndTokenCheck:
    added = tok.added_by_content.get(end_text)
    end_id = added.id if added is not None else None
    hist = last_token_histogram(tok, output_ids)
    ending = int(hist.loc[hist["id"] == end_id, "count"].sum()) if end_id is not None else 0
    return EndTokenCheck(end_text, end_id, int(hist["count"].sum()), ending, hist)


# -- verdict --------------------------------------------------------------------------------------------
@dataclass
class Verdict:
    """PASS, WARN (round-trip failures to know about) or FAIL (an id is wrong), with reasons."""

    level: str
    lines: list[str]

    def __str__(self) -> str:
        return "\n".join([self.level, *("  - " + line for line in self.lines)])


def verdict(tok: Tokenizer, table: pd.DataFrame, expected: pd.DataFrame | None = None,
            end_check: EndTokenCheck | None = None) -> Verdict:
    """FAIL if an id differs from the config or the expected ids, or real samples end with another
    token than the configured end token; WARN if an added token does not round-trip; else PASS."""
    lines, level = [], "PASS"
    n = len(table)
    wrong = table[table["config_check"].isin(["mismatch", "missing"])]
    if len(wrong):
        level = "FAIL"
        for r in wrong.itertuples():
            lines.append(f"{r.content!r}: config declares id {r.config_id}, tokenizer has "
                         + ("no such token" if r.config_check == "missing" else f"id {r.id}"))
    else:
        declared = int((table["config_check"] == "match").sum())
        lines.append(f"{n} added tokens; {declared} checked against the config, all at their declared ids"
                     if declared else f"{n} added tokens; the tokenizer file is its own declaration")
    if expected is not None and len(expected):
        bad = expected[~expected["ok"]]
        if len(bad):
            level = "FAIL"
            lines += [
                f"{r.content!r}: expected id {r.expected_id}, tokenizer has "
                + ("no such token" if pd.isna(r.actual_id) else f"id {r.actual_id}")
                for r in bad.itertuples()
            ]
        else:
            lines.append(f"expected ids: {len(expected)}/{len(expected)} match")
    if end_check is not None:
        if not end_check.ok:
            level = "FAIL"
        lines.append(("end token: " if end_check.ok else "end token is not what ends the samples: ") + end_check.message())
    loaded = table[table["config_check"] != "missing"]
    failing = loaded[~loaded["roundtrip"]]
    lines.append(f"round-trip: {len(loaded) - len(failing)}/{len(loaded)} added tokens decode to their text and encode back to their id")
    if len(failing) and level == "PASS":
        level = "WARN"
    for r in failing.head(5).itertuples():
        lines.append(f"does not round-trip: {r.content!r} (id {r.id}) decodes to {r.decoded!r}, encodes to {r.encoded}")
    return Verdict(level, lines)
