"""The store contract (docs/design.md §10), run against both backends: a real SQLite file and a real
PostgreSQL database. Each concern in turn: sessions, offloads, memories and search, audit."""

from __future__ import annotations

import hashlib
import hmac
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import attrs
import pytest
from conftest import PASSWORD_ENV

from ragent_memory.core.records import AuditRow, Draft, Plan, SessionState, Substitution
from ragent_memory.errors import StoreError
from ragent_memory.settings import StoreSettings
from ragent_memory.store import COMPACTION_COLUMNS, Backend, open_store, substitution_key
from ragent_memory.text.terms import fts_query, index_terms, search_terms

pytestmark = pytest.mark.both_backends

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def open_(store_settings: StoreSettings, clock: Clock) -> Iterator[Callable[[], Backend]]:
    """Opens stores on the test's database (each a separate connection, like another host)."""
    opened: list[Backend] = []

    def make() -> Backend:
        store = open_store(store_settings, clock=clock)
        opened.append(store)
        return store

    yield make
    for store in opened:
        store.close()


@pytest.fixture
def store(open_: Callable[[], Backend]) -> Backend:
    return open_()


def plan(*new: tuple[str, frozenset[int]], retracted: frozenset[int] = frozenset()) -> Plan:
    drafts = tuple(
        Draft(-(i + 1), content, 10**6 + i, True, replaces)
        for i, (content, replaces) in enumerate(new)
    )
    return Plan(drafts, retracted, frozenset(), len(new), 0, 0, 0, 0, 0, False)


# ---------------------------------------------------------------------------- sessions


def test_session_state_round_trips(store: Backend) -> None:
    """A saved session comes back whole, verbatim user requests and CJK included."""
    state = SessionState(
        "s1",
        user_id="u1",
        generation=2,
        last_generation=2,
        summary="## 目标\n退款",
        body="## 目标",
        prefix_len=1,
        covered=9,
        covered_digest="abc",
        verbatim=({"role": "user", "content": "请退款"},),
    )
    assert store.load_session("s1") is None
    store.save_session(state)
    assert state == store.load_session("s1")


def test_a_generation_commits_only_over_the_state_it_started_from(store: Backend) -> None:
    """commit_generation is a compare-and-set: a late compaction loses to a newer one."""
    start = SessionState("s1")
    first = SessionState("s1", generation=1, last_generation=1, summary="one")
    late = SessionState("s1", generation=1, last_generation=1, summary="late")
    assert store.commit_generation(first, start)
    assert not store.commit_generation(late, start)
    assert first == store.load_session("s1")


def test_a_dropped_session_refuses_a_late_generation(store: Backend) -> None:
    """After drop_session, a compaction that started before cannot resurrect it."""
    store.save_session(SessionState("s1", generation=1, last_generation=1))
    store.drop_session("s1")
    late = SessionState("s1", generation=2, last_generation=2)
    assert not store.commit_generation(late, SessionState("s1", generation=1, last_generation=1))
    assert store.load_session("s1") is None


def test_substitutions_are_keyed_by_position_and_digest(store: Backend) -> None:
    """The same content at another position is another substitution; saving again replaces."""
    a = Substitution(substitution_key(3, "d"), "trim", "rm-a", {"role": "tool", "content": "[a]"})
    b = Substitution(substitution_key(7, "d"), "truncate", "rm-b", {"role": "tool", "content": "b"})
    store.save_substitutions("s1", [(a, ["original a"]), (b, ["original b"])], ttl_days=7)
    a2 = Substitution(a.key, "trim", "rm-a", {"role": "tool", "content": "[a, again]"})
    store.save_substitutions("s1", [(a2, [])], ttl_days=7)
    assert {a.key: a2, b.key: b} == store.substitutions("s1")
    assert {} == store.substitutions("s2")


def test_drop_session_clears_state_and_keeps_the_audit(store: Backend) -> None:
    """Dropped: summary state and substitutions go at once, audit rows stay."""
    sub = Substitution(substitution_key(1, "d"), "trim", "rm-a", {"role": "tool", "content": "x"})
    store.save_session(SessionState("s1", generation=1, last_generation=1))
    store.save_substitutions("s1", [(sub, ["original"])], ttl_days=7)
    store.audit(AuditRow(session_id="s1", generation=1, status="applied"))
    store.drop_session("s1")
    assert (None, {}) == (store.load_session("s1"), store.substitutions("s1"))
    assert 1 == len(store.compactions("s1"))


# ---------------------------------------------------------------------------- offloads


@pytest.mark.parametrize("text", ["plain", "退款政策 🎉", "nul\x00inside", "lone \udc80 surrogate"])
def test_offloads_return_the_original_exactly(store: Backend, text: str) -> None:
    """Any Python text survives offload and recall, NULs and lone surrogates included."""
    sub = Substitution(substitution_key(1, "d"), "trim", "rm-x", {"role": "tool", "content": "-"})
    store.save_substitutions("s1", [(sub, [text])], ttl_days=7)
    assert text == store.read_offload("s1", store.ref_for("s1", text))


def test_one_save_offloads_every_original_of_its_substitutions(
    store: Backend, clock: Clock
) -> None:
    """A trim turn's save writes all its originals at once (repeats and an earlier one
    among them): each reads back by its ref, the earlier one's expiry is extended, and a ref
    is still what stores written before made it (HMAC-SHA256 of session and content hash under
    the store's secret, cut to 20 hex chars), so their sticky placeholders keep resolving."""
    first = Substitution(substitution_key(1, "d"), "trim", "rm-1", {"role": "tool", "content": "-"})
    store.save_substitutions("s1", [(first, ["early"])], ttl_days=1)
    clock.now += timedelta(hours=20)
    texts = [["a", "b", "a"], ["early", "退款 \x00 \udc80"], []]
    subs = [
        Substitution(
            substitution_key(i + 2, "d"), "trim", f"rm-{i}", {"role": "tool", "content": "-"}
        )
        for i in range(len(texts))
    ]
    store.save_substitutions("s1", list(zip(subs, texts, strict=True)), ttl_days=1)
    assert {s.key for s in (first, *subs)} == set(store.substitutions("s1"))
    for text in ("a", "b", "early", "退款 \x00 \udc80"):
        assert text == store.read_offload("s1", store.ref_for("s1", text))
    clock.now += timedelta(hours=20)  # past the first save's expiry, within the second's
    store.gc()
    assert "early" == store.read_offload("s1", store.ref_for("s1", "early"))
    sha = hashlib.sha256(b"a").hexdigest()
    mac = hmac.new(store._secret, f"s1\0{sha}".encode(), hashlib.sha256)  # type: ignore[attr-defined]
    assert store.ref_for("s1", "a") == "rm-" + mac.hexdigest()[:20]


def test_refs_are_bound_to_their_session(open_: Callable[[], Backend]) -> None:
    """A ref is stable across connections to one store and resolves only in its session."""
    store, other_host = open_(), open_()
    sub = Substitution(substitution_key(1, "d"), "trim", "rm-x", {"role": "tool", "content": "-"})
    store.save_substitutions("s1", [(sub, ["secret text"])], ttl_days=7)
    ref = store.ref_for("s1", "secret text")
    assert ref == other_host.ref_for("s1", "secret text")
    assert "secret text" == other_host.read_offload("s1", ref)
    assert other_host.read_offload("s2", ref) is None
    assert store.read_offload("s1", "rm-00000000000000000000") is None


def test_gc_deletes_expired_and_dropped_offloads(store: Backend, clock: Clock) -> None:
    """Expired offloads and every offload of a dropped session go; the report counts bytes."""
    sub = Substitution(substitution_key(1, "d"), "trim", "rm-x", {"role": "tool", "content": "-"})
    store.save_substitutions("old", [(sub, ["é" * 10])], ttl_days=1)
    clock.now += timedelta(days=3)
    store.save_substitutions("live", [(sub, ["kept"])], ttl_days=7)
    store.save_substitutions("gone", [(sub, ["dropped"])], ttl_days=7)
    store.drop_session("gone")
    assert store.read_offload("old", store.ref_for("old", "é" * 10)) is None
    report = store.gc()
    assert (1, 1, 1, 20 + 7) == (
        report.expired_offloads,
        report.dropped_sessions,
        report.dropped_offloads,
        report.freed_bytes,
    )
    assert "kept" == store.read_offload("live", store.ref_for("live", "kept"))
    assert 0 == store.gc().expired_offloads


def test_a_revived_session_starts_a_new_life(store: Backend) -> None:
    """A dropped id used again: the old life's offloads are gone, new ones are kept by gc."""
    sub = Substitution(substitution_key(1, "d"), "trim", "rm-x", {"role": "tool", "content": "-"})
    store.save_substitutions("s1", [(sub, ["old life"])], ttl_days=7)
    store.drop_session("s1")
    store.revive("s1")
    store.save_substitutions("s1", [(sub, ["new life"])], ttl_days=7)
    assert 0 == store.gc().dropped_offloads
    assert "new life" == store.read_offload("s1", store.ref_for("s1", "new life"))
    assert store.read_offload("s1", store.ref_for("s1", "old life")) is None


# ---------------------------------------------------------------------------- memories


def test_user_messages_are_recorded_once(store: Backend) -> None:
    """Recording is idempotent per (user, session, digest); the cursor moves."""
    items = [(0, "d0", "I live in Lisbon."), (2, "d2", "I like tea.")]
    assert 2 == store.record_user_messages("u1", "s1", items, seen=3, last_digest="d2")
    assert 2 == store.record_user_messages("u1", "s1", items, seen=3, last_digest="d2")
    assert (3, "d2") == store.memory_cursor("u1", "s1")
    assert store.memory_cursor("u1", "s2") is None
    pending = store.pending_messages("u1", limit=1)
    assert [(0, "I live in Lisbon.", 0)] == [(p.raw_index, p.content, p.attempts) for p in pending]


def test_failed_pending_messages_are_dropped_after_max_attempts(store: Backend) -> None:
    """Each failure counts; at max_attempts the messages are deleted."""
    store.record_user_messages("u1", "s1", [(0, "d0", "hello")], seen=1, last_digest="d0")
    ids = [p.id for p in store.pending_messages("u1", limit=10)]
    assert 0 == store.fail_pending("u1", ids, max_attempts=2)
    assert 1 == store.fail_pending("u1", ids, max_attempts=2)
    assert [] == store.pending_messages("u1", limit=10)


def test_a_batch_commits_facts_and_ends_the_ones_it_replaces(store: Backend) -> None:
    """New facts, a supersede and a retract land in one transaction; versions move."""
    store.record_user_messages(
        "u1", "s1", [(0, "d0", "a"), (1, "d1", "b")], seen=2, last_digest="d1"
    )
    first = [p.id for p in store.pending_messages("u1", limit=1)]
    store.commit_memories(
        "u1",
        first,
        plan(("Lives in Lisbon", frozenset()), ("Likes tea", frozenset())),
        session_id="s1",
    )
    lisbon, tea = store.facts("u1")
    version = store.memory_version("u1")
    second = [p.id for p in store.pending_messages("u1", limit=1)]
    store.commit_memories(
        "u1",
        second,
        plan(("Lives in Porto", frozenset({lisbon.id})), retracted=frozenset({tea.id})),
        session_id="s1",
    )
    assert ["Lives in Porto"] == [f.content for f in store.facts("u1")]
    statuses = {r["content"]: r["status"] for r in store.memory_rows("u1", kind="fact")}
    assert {
        "Lives in Lisbon": "superseded",
        "Likes tea": "retracted",
        "Lives in Porto": "active",
    } == statuses
    assert version < store.memory_version("u1")


def test_a_stale_batch_writes_nothing(store: Backend) -> None:
    """A batch whose pending messages are gone, or whose fact ended meanwhile, is refused."""
    store.record_user_messages("u1", "s1", [(0, "d0", "a")], seen=1, last_digest="d0")
    ids = [p.id for p in store.pending_messages("u1", limit=5)]
    store.commit_memories("u1", ids, plan(("Fact", frozenset())), session_id="s1")
    with pytest.raises(StoreError, match="stale"):
        store.commit_memories("u1", ids, plan(("Other", frozenset())), session_id="s1")
    assert ["Fact"] == [f.content for f in store.facts("u1")]


@pytest.mark.parametrize(
    ("summary", "query"),
    [
        ("The user plans a trip to Lisbon in May.", "When is the Lisbon trip?"),
        ("用户计划五月去北京旅行。", "北京旅行是什么时候？"),
    ],
)
def test_summaries_are_searchable_from_other_sessions(
    store: Backend, summary: str, query: str
) -> None:
    """English and Chinese summaries match; never the asking session, never another user."""
    store.record_summary("u1", "s1", 1, summary, [(index_terms(summary), summary)])
    store.record_summary("u2", "s9", 1, summary, [(index_terms(summary), summary)])
    fts = fts_query(search_terms(query))
    assert [summary] == store.search_summaries("u1", fts, exclude_session="s2", limit=5)
    assert [] == store.search_summaries("u1", fts, exclude_session="s1", limit=5)
    assert [] == store.search_summaries("u3", fts, exclude_session="s2", limit=5)


def test_the_best_matching_excerpt_comes_first(store: Backend) -> None:
    """Ranking: the excerpt sharing more query terms is first."""
    one, two = "refund policy", "refund policy for damaged parcels"
    store.record_summary("u1", "s1", 1, "x", [(index_terms(one), one), (index_terms(two), two)])
    fts = fts_query(search_terms("damaged parcels refund"))
    assert [two, one] == store.search_summaries("u1", fts, exclude_session="s2", limit=5)


def test_a_new_summary_supersedes_the_sessions_previous_one(store: Backend) -> None:
    """Only the latest summary of a session is active and searchable."""
    store.record_summary("u1", "s1", 1, "old lisbon", [("old lisbon", "old lisbon")])
    store.record_summary("u1", "s1", 2, "new lisbon", [("new lisbon", "new lisbon")])
    fts = fts_query(["lisbon"])
    assert ["new lisbon"] == store.search_summaries("u1", fts, exclude_session="x", limit=5)
    rows = store.memory_rows("u1", kind="summary")
    assert [("superseded", 1), ("active", 2)] == [(r["status"], r["generation"]) for r in rows]


def test_forget_erases_a_user_and_never_reuses_a_version(store: Backend) -> None:
    """forget removes memories, index and pending; a version seen before never comes back."""
    store.record_user_messages("u1", "s1", [(0, "d0", "a")], seen=1, last_digest="d0")
    store.record_summary("u1", "s1", 1, "lisbon", [("lisbon", "lisbon")])
    store.record_summary("u2", "s2", 1, "lisbon", [("lisbon", "lisbon")])
    before = store.memory_version("u1")
    forgotten = store.forget("u1")
    assert (1, 1) == (forgotten.memories, forgotten.pending)
    assert ([], 0) == (store.memory_rows("u1"), store.memory_version("u1"))
    assert [] == store.search_summaries("u1", fts_query(["lisbon"]), exclude_session="x", limit=5)
    assert ["lisbon"] == store.search_summaries(
        "u2", fts_query(["lisbon"]), exclude_session="x", limit=5
    )
    store.record_summary("u1", "s1", 2, "again", [("again", "again")])
    assert store.memory_version("u1") > before


# ---------------------------------------------------------------------------- audit


def test_audit_rows_have_the_documented_columns(store: Backend, clock: Clock) -> None:
    """compactions rows: docs/design.md §10's columns, ids ascending, filtered by session."""
    first = store.audit(AuditRow(session_id="s1", generation=1, status="applied", summary="x"))
    second = store.audit(AuditRow(session_id="s2", generation=0, status="failed", error="boom"))
    assert first < second
    rows = store.compactions()
    assert [list(COMPACTION_COLUMNS)] * 2 == [list(r) for r in rows]
    assert [("s1", "applied", "2025-03-01T12:00:00.000Z")] == [
        (r["session_id"], r["status"], r["created_at"]) for r in store.compactions("s1")
    ]


def test_an_audit_row_writes_every_column_and_says_only_what_it_knows(store: Backend) -> None:
    """AuditRow's fields are the compactions columns but the store's id and created_at, and
    what a row leaves out reads back as the table's own default (NULL, 0 or "")."""
    assert [c for c in COMPACTION_COLUMNS if c not in ("id", "created_at")] == [
        f.name for f in attrs.fields(AuditRow)
    ]
    given = {"session_id": "s1", "generation": 2, "status": "invalidated"}
    store.audit(AuditRow(session_id="s1", generation=2, status="invalidated"))
    (row,) = store.compactions("s1")
    nulls = ("user_id", "reason", "model", "summary", "error")
    expected = {
        c: None if c in nulls else "" if c == "written_by" else 0
        for c in COMPACTION_COLUMNS
        if c not in (*given, "id", "created_at")
    }
    assert {**given, **expected} == {k: row[k] for k in (*given, *expected)}


def test_audit_refuses_a_loose_dict_and_a_second_applied_generation(store: Backend) -> None:
    """A dict instead of an AuditRow and a duplicate applied (session, generation) are
    StoreErrors, the first naming what it got."""
    loose: Any = {"session_id": "s1", "generation": 1, "status": "applied", "colour": "red"}
    with pytest.raises(StoreError, match="an AuditRow, not dict"):
        store.audit(loose)
    assert [] == store.compactions()
    store.audit(AuditRow(session_id="s1", generation=1, status="applied"))
    with pytest.raises(StoreError):
        store.audit(AuditRow(session_id="s1", generation=1, status="applied"))
    store.audit(AuditRow(session_id="s1", generation=1, status="failed"))


# ---------------------------------------------------------------------------- hosts


def test_one_host_at_a_time_holds_a_compaction_lease(open_: Callable[[], Backend]) -> None:
    """A second host is refused while the first holds the lease, and gets it once released."""
    first, second = open_(), open_()
    assert first.host_id != second.host_id
    assert first.claim_compaction("s1")
    assert not second.claim_compaction("s1")
    assert first.claim_compaction("s1")  # renewing one's own lease
    assert second.claim_compaction("s2")  # other sessions are independent
    first.release_compaction("s1")
    assert second.claim_compaction("s1")


def test_a_dead_hosts_lease_expires(open_: Callable[[], Backend], clock: Clock) -> None:
    """After lease_s another host may claim; the old holder's release then takes nothing."""
    dead, alive = open_(), open_()
    assert dead.claim_compaction("s1")
    clock.now += timedelta(seconds=alive.lease_s - 1)
    assert not alive.claim_compaction("s1")
    clock.now += timedelta(seconds=1)
    assert alive.claim_compaction("s1")
    dead.release_compaction("s1")
    assert not dead.claim_compaction("s1")


def test_the_last_writer_of_a_session_is_known(open_: Callable[[], Backend]) -> None:
    """Every session write records its host; the counter moves with each write."""
    first, second = open_(), open_()
    sub = Substitution(substitution_key(1, "d"), "trim", "rm-x", {"role": "tool", "content": "-"})
    assert first.last_write("s1") is None
    first.save_session(SessionState("s1"))
    assert (first.host_id, 1) == second.last_write("s1")
    second.save_substitutions("s1", [(sub, ["x"])], ttl_days=7)
    assert (second.host_id, 2) == first.last_write("s1")
    assert second.commit_generation(
        SessionState("s1", generation=1, last_generation=1), SessionState("s1")
    )
    first.drop_session("s1")
    assert (first.host_id, 4) == second.last_write("s1")


# ---------------------------------------------------------------------------- the whole store


def test_migrations_are_recorded_in_the_database(
    backend: str, db_path: str, request: pytest.FixtureRequest, clock: Clock
) -> None:
    """A new store applies every migration once; opening it again applies none."""
    settings = StoreSettings(path=db_path)
    if backend == "postgres":
        settings = StoreSettings(
            url=request.getfixturevalue("fresh_pg_url"), password_env=PASSWORD_ENV
        )
    with open_store(settings, clock=clock) as first:
        names = first.migrations()
    clock.now += timedelta(days=1)
    with open_store(settings, clock=clock) as second:
        assert names == second.migrations()
    assert names and len(set(names)) == len(names)


def test_threads_share_one_store(store: Backend) -> None:
    """Many threads writing at once: every write lands, none is lost or doubled."""

    def work(n: int) -> None:
        for i in range(20):
            store.audit(AuditRow(session_id=f"s{n}", generation=i, status="applied"))
            store.record_user_messages(
                "u", f"s{n}", [(i, f"d{i}", "x")], seen=i + 1, last_digest="d"
            )

    threads = [threading.Thread(target=work, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    assert 120 == len(store.compactions())
    assert 120 == len(store.pending_messages("u", limit=1000))


def test_a_closed_store_raises_store_error(store: Backend) -> None:
    """Every call after close is a StoreError, not a driver exception."""
    store.close()
    with pytest.raises(StoreError):
        store.load_session("s1")
