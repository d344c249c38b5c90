"""Long-term memory extraction against the labelled corpus (issue 34): precision and recall of
the facts learnt from what users say, per kind and per language.

    python -m benchmarks.facts                      # the offline extractor, whole corpus
    python -m benchmarks.facts --base-url URL [--model local] [--subset 60] [--batch 3]

The corpus (``benchmarks/data/facts_{en,zh}.jsonl``, written for this project) labels each
user utterance with the facts it states (each as terms a stored fact must contain, and whether
it is a negation) or, for a distractor, its kind (question, hypothetical, reported speech,
transient state, request, small talk, pasted text, role play). A learnt fact is true when it
matches a labelled fact of its batch; precision is true facts / facts learnt, recall is labelled
facts matched / labelled facts.

With ``--base-url`` (or ``RAGENT_FACTS_BASE_URL``) the model extractor runs too, on a stratified
subset of the held-out sets (every kind and distractor kind in turn), the utterances sent
``--batch`` at a time as the engine sends its pending messages; the offline extractor runs on the
same batches, side by side. Those figures go to ``results/facts_model.json`` with the command
that made them; ``results/facts.json`` holds the offline run over the whole corpus.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import attrs

from ragent_memory.errors import ExtractionError
from ragent_memory.longterm.model import build_extractor
from ragent_memory.longterm.offline import OfflineExtractor
from ragent_memory.longterm.vocabulary import (
    Add,
    Extraction,
    ExtractionRequest,
    Extractor,
    Supersede,
)
from ragent_memory.settings import LLMSettings, Settings

DATA = Path(__file__).resolve().parent / "data"
RESULTS = Path(__file__).resolve().parent / "results"
LANGUAGES = ("en", "zh")
TARGET_RECALL, TARGET_PRECISION = 0.80, 0.95
NEGATION = re.compile(
    r"\b(?:not|no longer|never|no|stopped|quit|gave up|former(?:ly)?|ex-|doesn't|isn't|won't)\b"
    r"|n't|不|没|戒|离开|从未",
    re.IGNORECASE,
)


@attrs.frozen
class Expected:
    kind: str
    terms: tuple[str, ...]
    negated: bool

    def matches(self, content: str) -> bool:
        text = " ".join(content.casefold().split())
        if not all(" ".join(t.casefold().split()) in text for t in self.terms):
            return False
        return not self.negated or NEGATION.search(content) is not None


@attrs.frozen
class Utterance:
    text: str
    language: str
    facts: tuple[Expected, ...]
    distractor: str | None

    @property
    def kind(self) -> str:
        """The kind a false fact from this utterance is counted against."""
        return self.distractor or self.facts[0].kind


def load(language: str, *, heldout: bool = False) -> list[Utterance]:
    """The corpus of one language (``heldout``: the set written after the patterns, never
    tuned on)."""
    rows = []
    path = DATA / f"facts_{'heldout_' if heldout else ''}{language}.jsonl"
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        row = json.loads(line)
        facts = tuple(Expected(f["kind"], tuple(f["terms"]), f["negated"]) for f in row["facts"])
        if bool(facts) == bool(row["distractor"]):
            raise ValueError(f"{path}:{number}: a row states facts or is a distractor, not both")
        rows.append(Utterance(row["text"], row["language"], facts, row["distractor"]))
    return rows


def extracted(extractor: Extractor, texts: Sequence[str], language: str) -> Extraction:
    """What ``extractor`` makes of ``texts`` as one batch, for a user with no facts yet."""
    return extractor.extract(ExtractionRequest((), tuple(texts), language))


def contents(extraction: Extraction) -> list[str]:
    """The facts an extraction learns."""
    return [op.content for op in extraction.operations if isinstance(op, Add | Supersede)]


def learnt(extractor: Extractor, texts: Sequence[str], language: str) -> list[str]:
    """The facts ``extractor`` learns from ``texts`` as one batch, for a user with none yet."""
    return contents(extracted(extractor, texts, language))


@attrs.define
class Tally:
    """Counts for one language, overall and per kind."""

    expected: Counter[str] = attrs.field(factory=Counter)  # labelled facts per kind
    found: Counter[str] = attrs.field(factory=Counter)  # of them matched
    true: Counter[str] = attrs.field(factory=Counter)  # learnt facts matching a label, per kind
    false: Counter[str] = attrs.field(factory=Counter)  # learnt facts matching none, per kind
    utterances: Counter[str] = attrs.field(factory=Counter)
    false_facts: list[tuple[str, str]] = attrs.field(factory=list)  # (utterance, fact)
    missed: list[tuple[str, str]] = attrs.field(factory=list)  # (utterance, kind)

    def add(self, batch: Sequence[Utterance], contents: Iterable[str]) -> None:
        open_facts = [(u, e) for u in batch for e in u.facts]
        matched: set[int] = set()
        for utterance in batch:
            self.utterances[utterance.kind] += 1
            for expected in utterance.facts:
                self.expected[expected.kind] += 1
        for content in contents:
            hits = [i for i, (_, e) in enumerate(open_facts) if e.matches(content)]
            fresh = [i for i in hits if i not in matched] or hits
            if fresh:
                matched.add(fresh[0])
                self.true[open_facts[fresh[0]][1].kind] += 1
                continue
            source = _source(batch, content)
            self.false[source.kind] += 1
            self.false_facts.append((source.text, content))
        for index, (utterance, expected) in enumerate(open_facts):
            if index in matched:
                self.found[expected.kind] += 1
            else:
                self.missed.append((utterance.text, expected.kind))

    def figures(self, kinds: Iterable[str] | None = None) -> dict[str, Any]:
        keys = list(self.utterances) if kinds is None else list(kinds)
        true = sum(self.true[k] for k in keys)
        false = sum(self.false[k] for k in keys)
        expected = sum(self.expected[k] for k in keys)
        found = sum(self.found[k] for k in keys)
        return {
            "utterances": sum(self.utterances[k] for k in keys),
            "expected": expected,
            "found": found,
            "learnt": true + false,
            "false": false,
            "precision": round(true / (true + false), 3) if true + false else None,
            "recall": round(found / expected, 3) if expected else None,
        }


def _source(batch: Sequence[Utterance], content: str) -> Utterance:
    """The utterance of a batch a false fact most likely came from (most shared bigrams)."""

    def grams(text: str) -> set[str]:
        text = text.casefold()
        return {text[i : i + 2] for i in range(len(text) - 1)}

    wanted = grams(content)
    return max(batch, key=lambda u: len(grams(u.text) & wanted))


def run(
    rows: Sequence[Utterance], extract: Callable[[Sequence[str], str], list[str]], batch: int
) -> Tally:
    tally = Tally()
    for start in range(0, len(rows), batch):
        chunk = rows[start : start + batch]
        tally.add(chunk, extract([u.text for u in chunk], chunk[0].language))
    return tally


def subset(rows: Sequence[Utterance], size: int) -> list[Utterance]:
    """Up to ``size`` utterances, every kind in turn (round robin over kinds, corpus order)."""
    by_kind: dict[str, list[Utterance]] = {}
    for row in rows:
        by_kind.setdefault(row.kind, []).append(row)
    picked: list[Utterance] = []
    while len(picked) < size and any(by_kind.values()):
        for queue in by_kind.values():
            if queue and len(picked) < size:
                picked.append(queue.pop(0))
    return sorted(picked, key=rows.index)


def report(tally: Tally) -> dict[str, Any]:
    fact_kinds = sorted(tally.expected)
    distractors = sorted(k for k in tally.utterances if k not in tally.expected)
    return {
        "overall": tally.figures(),
        "facts": tally.figures(fact_kinds),
        "distractors": tally.figures(distractors),
        "kinds": {k: tally.figures([k]) for k in [*fact_kinds, *distractors]},
        "false_facts": [list(pair) for pair in tally.false_facts],
        "missed": [list(pair) for pair in tally.missed],
    }


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def print_table(title: str, results: dict[str, dict[str, Any]]) -> None:
    """Kinds as rows, each language's (and arm's) precision and recall as columns."""
    print(f"\n{title}")
    columns = list(results)
    print(f"{'kind':<16}" + "".join(f"{c:>22}" for c in columns))
    kinds: list[str] = []
    for result in results.values():
        kinds += [k for k in result["kinds"] if k not in kinds]
    for kind in ["overall", *kinds]:
        cells = []
        for result in results.values():
            figures = result["overall"] if kind == "overall" else result["kinds"].get(kind)
            if figures is None:
                cells.append("")
                continue
            cell = f"P {_pct(figures['precision'])} R {_pct(figures['recall'])} n{figures['utterances']}"
            cells.append(cell)
        print(f"{kind:<16}" + "".join(f"{c:>22}" for c in cells))


def offline_extract(texts: Sequence[str], language: str) -> list[str]:
    return learnt(OfflineExtractor(), texts, language)


def commit() -> str:
    done = subprocess.run(
        ["git", "describe", "--always", "--dirty"],
        cwd=DATA.parent,
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.strip() or "unknown"


def guarded(
    extractor: Extractor, failed: list[str], rejected: Counter[str]
) -> Callable[[Sequence[str], str], list[str]]:
    """``extractor`` for :func:`run`: a batch with no valid operations after the client's
    retries learns nothing and is listed in ``failed``; ``rejected`` counts the items the
    extractor's checks refused (ungrounded, copied, over the limit) and the batches the
    gates left nothing of (no call)."""

    def extract(texts: Sequence[str], language: str) -> list[str]:
        started = time.perf_counter()
        try:
            extraction = extracted(extractor, texts, language)
        except ExtractionError as err:
            failed.append(str(err))
            found, refused, calls = [], 0, 1
        else:
            found, refused, calls = contents(extraction), extraction.rejected, extraction.attempts
        rejected["items"] += refused
        rejected["batches not sent"] += not calls
        took = time.perf_counter() - started
        print(
            f"  model batch ({language}, {len(texts)}): {took:.0f} s → {found}"
            f" ({refused} rejected{'' if calls else ', not sent'})",
            flush=True,
        )
        return found

    return extract


def model_run(args: argparse.Namespace) -> dict[str, Any]:
    """The model and offline extractors side by side on a stratified subset of the held-out
    sets (the offline patterns were tuned on the corpus, so it would flatter them)."""
    llm = LLMSettings(
        base_url=args.base_url,
        model=args.model,
        timeout_s=args.timeout,
        max_retries=args.retries,
        offline_fallback=False,
    )
    extractor = build_extractor(Settings(llm=llm, language="en"))
    started, started_utc, results = time.perf_counter(), datetime.now(UTC), {}
    try:
        for language in LANGUAGES:
            rows = subset(load(language, heldout=True), args.subset // len(LANGUAGES))
            results[f"offline {language}"] = report(run(rows, offline_extract, args.batch))

            failed: list[str] = []
            rejected: Counter[str] = Counter()
            extract = guarded(extractor, failed, rejected)
            results[f"model {language}"] = report(run(rows, extract, args.batch))
            results[f"model {language}"]["failed_batches"] = failed
            results[f"model {language}"]["rejected"] = dict(rejected)
            print_table(f"{language}: offline vs model (batches of {args.batch})", results)
    finally:
        extractor.close()
    return {
        "recorded": {
            "commit": commit(),
            "started_utc": started_utc.strftime("%Y-%m-%d %H:%M"),
            "wall_s": round(time.perf_counter() - started, 1),
            "command": " ".join(["python -m benchmarks.facts", *sys.argv[1:]]),
            "model": args.model,
        },
        "batch": args.batch,
        "results": results,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default=os.environ.get("RAGENT_FACTS_BASE_URL"))
    parser.add_argument("--model", default=os.environ.get("RAGENT_FACTS_MODEL", "local"))
    parser.add_argument("--subset", type=int, default=60, help="utterances for the model run")
    parser.add_argument("--batch", type=int, default=3, help="utterances per extraction")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per model call")
    parser.add_argument("--retries", type=int, default=1, help="model retries per batch")
    args = parser.parse_args()
    corpus = {language: load(language) for language in LANGUAGES}
    heldout = {f"{language} held-out": load(language, heldout=True) for language in LANGUAGES}
    offline = {
        name: report(run(rows, offline_extract, 1)) for name, rows in {**corpus, **heldout}.items()
    }
    print_table("offline extractor, each utterance alone", offline)
    for language, result in offline.items():
        overall = result["overall"]
        print(
            f"{language}: precision {_pct(overall['precision'])} recall {_pct(overall['recall'])}"
            f" (targets: precision ≥ {TARGET_PRECISION}, recall ≥ {TARGET_RECALL})"
        )
    RESULTS.mkdir(exist_ok=True)
    sizes = {k: len(v) for k, v in {**corpus, **heldout}.items()}
    out = {"corpus": sizes, "offline": offline}
    (RESULTS / "facts.json").write_text(
        json.dumps(out, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    if args.base_url:
        data = model_run(args)
        (RESULTS / "facts_model.json").write_text(
            json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
        )


if __name__ == "__main__":
    main()
