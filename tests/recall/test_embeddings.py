"""Optional dense recall (docs/design.md §9b, ``recall.embeddings``): the real ``openai`` SDK
against a scripted ``/v1/embeddings`` server on 127.0.0.1 whose vectors are bags of concepts,
so a question in other words than the answer's is near it while sharing no word with it."""

from __future__ import annotations

import json
import re
import sqlite3
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import pytest

from ragent_memory import Settings, StoreSettings
from ragent_memory.core.records import IndexedMessage
from ragent_memory.engine.memory_engine import MemoryEngine
from ragent_memory.errors import ConfigError
from ragent_memory.recall import dense as dense_recall
from ragent_memory.recall.dense import VectorCache, reciprocal_rank_fusion
from ragent_memory.recall.excerpts import Ask
from ragent_memory.settings import load_settings
from ragent_memory.store import Store

# The engine end to end on both stores (docs/design.md §10: one contract, the same suite).
pytestmark = pytest.mark.both_backends

CONCEPTS = (
    {"pet", "puppy", "dog", "kitten", "cat", "animal"},
    {"travel", "trip", "flight", "journey", "lisbon", "abroad"},
    {"music", "guitar", "song", "concert", "piano"},
    {"food", "dinner", "soup", "recipe", "cook"},
    {"work", "office", "deadline", "meeting", "report"},
)
WORD = re.compile(r"[a-z]+")


def concept_vector(text: str) -> list[float]:
    """How often ``text`` names each concept, and a small constant (no zero vector)."""
    words = WORD.findall(text.lower())
    return [*(float(sum(w in c for w in words)) for c in CONCEPTS), 0.05]


class EmbeddingServer:
    """``POST /v1/embeddings`` answering bag-of-concepts vectors; records each request's
    inputs and Authorization header. A request holding a text ``refuse`` picks is answered
    400 as OpenAI answers bad input (the whole batch)."""

    def __init__(self) -> None:
        self.inputs: list[list[str]] = []
        self.authorizations: list[str | None] = []
        self.refuse: Callable[[str], bool] = lambda text: False
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                texts = body["input"]
                server.inputs.append(list(texts))
                server.authorizations.append(self.headers.get("Authorization"))
                if any(map(server.refuse, texts)):
                    error = {"message": "input is not valid", "type": "invalid_request_error"}
                    raw = json.dumps({"error": error}).encode()
                    self.send_response(400)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(raw)))
                    self.end_headers()
                    self.wfile.write(raw)
                    return
                data = [
                    {"object": "embedding", "index": i, "embedding": concept_vector(t)}
                    for i, t in enumerate(texts)
                ]
                usage = {"prompt_tokens": 1, "total_tokens": 1}
                payload = {"object": "list", "data": data, "model": body["model"], "usage": usage}
                raw = json.dumps(payload).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def texts(self) -> list[str]:
        return [text for batch in self.inputs for text in batch]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=10)


@pytest.fixture
def server() -> Iterator[EmbeddingServer]:
    embedding_server = EmbeddingServer()
    yield embedding_server
    embedding_server.close()


def dense(base_url: str, **more: Any) -> dict[str, Any]:
    return {"embeddings": {"base_url": base_url, "model": "concepts", **more}}


REX = "Last spring I adopted a puppy; his name is Rex."
TOM = "I adopted a kitten called Tom in March."
FILLER = (
    "The quarterly report is due on Friday, and the meeting moved to noon.",
    "We cooked a lentil soup from my grandmother's recipe.",
    "My flight to Lisbon leaves early on Sunday.",
)
QUESTION = "Which kind of pet do I own?"  # no word shared with REX


def tell(engine: MemoryEngine, user: str, said: str, session: str) -> None:
    history: list[dict[str, Any]] = []
    for text in (*FILLER, said):
        history += [{"role": "user", "content": text}, {"role": "assistant", "content": "Noted."}]
    engine.after_turn(history, session_id=session, user_id=user)
    engine.flush()


def block(engine: MemoryEngine, question: str, session: str, user: str | None) -> str:
    """The recall block ``prepare`` puts in front of ``question`` ("" for none)."""
    asked = [{"role": "user", "content": question}]
    content = engine.prepare(asked, session_id=session, user_id=user).messages[-1]["content"]
    return str(content[0]["text"]) if isinstance(content, list) else ""


def test_a_paraphrase_is_recalled_only_with_embeddings(
    make_engine: Callable[..., MemoryEngine],
    make_settings: Callable[..., Settings],
    server: EmbeddingServer,
) -> None:
    """The question shares no word with the answer: BM25 alone recalls nothing of it, fused
    with the dense list it recalls Rex; another user's kitten never comes back."""
    plain = make_engine(make_settings())
    tell(plain, "u0", REX, "z")
    assert "Rex" not in block(plain, QUESTION, "q", "u0")
    plain.close()

    engine = make_engine(make_settings(recall=dense(server.base_url)))
    tell(engine, "u1", REX, "a")
    tell(engine, "u2", TOM, "b")
    found = block(engine, QUESTION, "q1", "u1")
    assert "Rex" in found and "Tom" not in found
    found = block(engine, QUESTION, "q2", "u2")
    assert "Tom" in found and "Rex" not in found
    assert "Rex" not in block(engine, QUESTION, "q3", None)  # no user: this session only
    assert "Rex" in engine.search("q4", "pet", user_id="u1")
    # What was indexed before embeddings were on is embedded on its user's first search.
    block(engine, QUESTION, "z1", "u0")
    engine.flush()
    assert "Rex" in block(engine, QUESTION, "z2", "u0")
    memory = engine.recall_memory()
    assert memory["vectors"] >= 2 * (len(FILLER) + 1) and memory["embed_failures"] == 0
    assert memory["vectors_bytes"] > 0 and memory["bytes"] <= memory["cap"]
    # every indexed message was embedded once, in batches; each question in one call
    texts = server.texts()
    assert (2, 1) == (texts.count(REX), texts.count(TOM))  # u0 and u1 said it; u2
    assert (5, 1) == (server.inputs.count([QUESTION]), server.inputs.count(["pet"]))


def test_forget_and_drop_take_the_vectors(
    make_engine: Callable[..., MemoryEngine],
    make_settings: Callable[..., Settings],
    server: EmbeddingServer,
) -> None:
    """A dropped session's and a forgotten user's messages are gone from dense recall too."""
    engine = make_engine(make_settings(recall=dense(server.base_url)))
    tell(engine, "u1", REX, "a")
    tell(engine, "u1", TOM, "b")
    assert "Rex" in engine.search("q", QUESTION, user_id="u1")
    engine.drop_session("a")
    found = engine.search("q", QUESTION, user_id="u1")
    assert "Rex" not in found and "Tom" in found
    engine.forget("u1")
    assert "Tom" not in engine.search("q", QUESTION, user_id="u1")
    assert 0 == engine.recall_memory()["vectors"]


def test_an_endpoint_down_leaves_bm25(
    make_engine: Callable[..., MemoryEngine],
    make_settings: Callable[..., Settings],
    closed_url: str,
) -> None:
    """Nothing listens: indexing and prepare go on, recall by words still works, the failures
    are counted."""
    engine = make_engine(make_settings(recall=dense(closed_url, timeout_s=5)))
    tell(engine, "u1", REX, "a")
    assert "Rex" in block(engine, "What is the puppy's name?", "q", "u1")
    assert "Rex" not in block(engine, QUESTION, "q2", "u1")
    memory = engine.recall_memory()
    assert memory["embed_failures"] >= 2 and memory["vectors"] == 0


POISON = "A pasted blob the endpoint will not take: <|endoftext|>"


def test_a_text_the_endpoint_refuses_does_not_hold_back_the_rest(
    make_engine: Callable[..., MemoryEngine],
    make_settings: Callable[..., Settings],
    server: EmbeddingServer,
) -> None:
    """The endpoint answers 400 to any batch holding one text: the batch is split until that
    text is alone, the rows after it are embedded, and it is never sent again; the breaker
    stays shut (the question's vector still comes). An endpoint that refuses everything marks
    nothing: once it takes texts, every row is embedded."""
    server.refuse = lambda text: "<|endoftext|>" in text
    engine = make_engine(make_settings(recall=dense(server.base_url, batch_size=8)))
    history: list[dict[str, Any]] = []
    for text in (FILLER[0], POISON, REX, *FILLER[1:]):
        history += [{"role": "user", "content": text}, {"role": "assistant", "content": "Noted."}]
    engine.after_turn(history, session_id="a", user_id="u1")
    engine.flush()
    assert "Rex" in block(engine, QUESTION, "q", "u1")  # by meaning: its row has a vector
    assert 1 <= server.texts().count(POISON) <= 4  # the batch, then halves down to itself
    sent = len(server.texts())
    more = [{"role": "user", "content": TOM}, {"role": "assistant", "content": "Noted."}]
    engine.after_turn([*history, *more], session_id="a", user_id="u1")
    engine.flush()
    assert [TOM, "Noted."] == server.texts()[sent:]  # the new rows alone, not the refused one
    assert "Tom" in block(engine, QUESTION, "q1", "u1")  # the vectors held read on a search
    memory = engine.recall_memory()
    assert memory["vectors"] == len(history) - 1 + 2 and memory["embed_failures"] >= 1

    server.refuse = lambda text: True  # a wrong model name, say: nothing is taken
    other = make_engine(make_settings(recall=dense(server.base_url, batch_size=8)))
    tell(other, "u2", TOM, "b")
    assert 0 == other.recall_memory()["vectors"]
    server.refuse = lambda text: False
    other.after_turn([{"role": "user", "content": "Back again."}], session_id="c", user_id="u2")
    other.flush()
    assert "Tom" in block(other, QUESTION, "q2", "u2")
    assert 2 * (len(FILLER) + 1) + 1 == other.recall_memory()["vectors"]


def test_vectors_survive_a_reopen(
    tmp_path: Path, server: EmbeddingServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The vectors are in the SQLite file: a new engine on it recalls by meaning at once and
    embeds nothing again but the question; the key goes in the Authorization header."""
    monkeypatch.setenv("EMBED_KEY", "sk-test-embeddings")
    settings = Settings(
        store=StoreSettings(path=str(tmp_path / "m.db")),
        recall=dense(server.base_url, api_key_env="EMBED_KEY", batch_size=3),
    )
    with MemoryEngine(settings) as engine:
        tell(engine, "u1", REX, "a")
    stored = sqlite3.connect(tmp_path / "m.db").execute(
        "SELECT COUNT(*), COUNT(embedding), MIN(LENGTH(embedding)) FROM recall_messages"
    )
    rows, embedded, width = stored.fetchone()
    assert rows == embedded == 2 * (len(FILLER) + 1) and width == 4 * (len(CONCEPTS) + 1)
    assert all(len(batch) <= 3 for batch in server.inputs)
    before = len(server.inputs)
    with MemoryEngine(settings) as engine:
        assert "Rex" in block(engine, QUESTION, "q", "u1")
        engine.after_turn([{"role": "user", "content": QUESTION}], session_id="q", user_id="u1")
        engine.flush()
    assert [[QUESTION], [QUESTION]] == server.inputs[before:]  # the turn's query, then its row
    assert {"Bearer sk-test-embeddings"} == set(server.authorizations)
    # Another model: the old one's vectors go, every row is embedded again by the new one.
    other = dense(server.base_url, api_key_env="EMBED_KEY", model="concepts-2")
    before = len(server.texts())
    with MemoryEngine(attrs.evolve(settings, recall=other)) as engine:
        engine.search("q2", QUESTION, user_id="u1")
        engine.flush()
        assert "Rex" in engine.search("q3", QUESTION, user_id="u1")
    assert rows + 1 + 2 == len(server.texts()) - before  # every row, and the two questions
    models = sqlite3.connect(tmp_path / "m.db").execute(
        "SELECT DISTINCT embedding_model FROM recall_messages"
    )
    assert [("concepts-2",)] == models.fetchall()


def test_what_the_view_shows_is_not_recalled(
    make_engine: Callable[..., MemoryEngine],
    make_settings: Callable[..., Settings],
    server: EmbeddingServer,
) -> None:
    """The session's own messages still in view are never among the dense hits either."""
    engine = make_engine(make_settings(recall=dense(server.base_url)))
    history = [{"role": "user", "content": REX}, {"role": "assistant", "content": "Noted."}]
    engine.after_turn(history, session_id="a", user_id="u1")
    engine.flush()
    asked = [*history, {"role": "user", "content": QUESTION}]
    prepared = engine.prepare(asked, session_id="a", user_id="u1")
    assert asked[-1] == prepared.messages[-1]  # no block: Rex is in view already
    assert "Rex" in block(engine, QUESTION, "b", "u1")  # from another session it is recalled


@pytest.mark.parametrize(
    ("yaml_text", "key_path"),
    [
        ("recall: {embeddings: {model: m}}", "recall.embeddings.base_url"),
        ("recall: {embeddings: {base_url: http://h/v1}}", "recall.embeddings.model"),
        ("recall: {embeddings: {base_url: h, model: m}}", "recall.embeddings.base_url"),
        ("recall: {embeddings: {base_url: http://h/v1, model: ''}}", "recall.embeddings.model"),
        (
            "recall: {embeddings: {base_url: http://h/v1, model: m, api_key_env: a-b}}",
            "recall.embeddings.api_key_env",
        ),
        (
            "recall: {embeddings: {base_url: http://h/v1, model: m, timeout_s: 0}}",
            "recall.embeddings.timeout_s",
        ),
        (
            "recall: {embeddings: {base_url: http://h/v1, model: m, batch_size: 0}}",
            "recall.embeddings.batch_size",
        ),
        ("recall: {embeddings: {base_url: http://h/v1, model: m, k: 1}}", "recall.embeddings.k"),
        ("recall: {embeddings: [http://h/v1]}", "recall.embeddings"),
        ("recall: {dense: true}", "recall.dense"),
        ("recall: on", "recall"),
    ],
)
def test_bad_values_name_their_key_path(tmp_path: Path, yaml_text: str, key_path: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(yaml_text + "\n", encoding="utf-8")
    with pytest.raises(ConfigError) as raised:
        load_settings(path)
    assert key_path == raised.value.key_path


def test_embeddings_are_off_by_default_and_read_from_yaml(tmp_path: Path) -> None:
    assert Settings().recall.embeddings is None
    path = tmp_path / "c.yaml"
    path.write_text(
        "recall:\n  embeddings: {base_url: http://h/v1, model: m, api_key_env: K}\n",
        encoding="utf-8",
    )
    embeddings = load_settings(path).recall.embeddings
    assert embeddings is not None
    assert ("http://h/v1", "m", "K") == (
        embeddings.base_url,
        embeddings.model,
        embeddings.api_key_env,
    )


def test_reciprocal_rank_fusion() -> None:
    """1 / (60 + rank) summed over the lists; ties keep the first list's order."""
    assert [2, 1, 3] == reciprocal_rank_fusion([1, 2], [2, 3])
    assert [1, 3, 2, 4] == reciprocal_rank_fusion([1, 2], [3, 4])
    assert [5, 6] == reciprocal_rank_fusion([], [5, 6])


def test_vectors_held_stay_within_their_bound(tmp_path: Path) -> None:
    """Past ``max_bytes`` the least recently searched user's vectors go; a user over it alone
    is ranked from the store each time, the same answer, nothing held."""
    with Store(str(tmp_path / "m.db")) as store:
        for user in ("u1", "u2"):
            rows = [
                IndexedMessage(f"{user}-s", i, "user", f"{user} {text}", digest=f"{user}{i}")
                for i, text in enumerate((*FILLER, REX))
            ]
            store.index_messages(user, rows, [row.content for row in rows])
            found = store.indexed_since(0, user_id=user, session_id=f"{user}-s")
            vectors = [np.asarray(concept_vector(m.content), "<f4").tobytes() for m, _ in found]
            store.store_vectors("m", [(m.id, v) for (m, _), v in zip(found, vectors, strict=True)])
        query = np.asarray(concept_vector(QUESTION), np.float32)
        ask = {user: Ask(QUESTION, "q", user, 10_000) for user in ("u1", "u2")}
        roomy = VectorCache(store, "m", max_bytes=10_000_000)
        best = {user: roomy.ranked(query, ask[user]) for user in ("u1", "u2")}
        assert 2 * len(rows) == roomy.memory()["vectors"]
        one = roomy.memory()["vectors_bytes"] // 2
        tight = VectorCache(store, "m", max_bytes=one + one // 2)
        assert best["u1"] == tight.ranked(query, ask["u1"])
        assert best["u2"] == tight.ranked(query, ask["u2"])
        assert len(rows) == tight.memory()["vectors"]  # u2's, the last searched
        assert tight.memory()["vectors_bytes"] <= one + one // 2
        texts = store.indexed_texts(best["u1"][:1])
        assert "Rex" in next(iter(texts.values()))


def test_a_user_whose_vectors_do_not_fit_keeps_the_newest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past ``max_bytes`` alone a user's oldest vectors are left out: dense recall ranks the
    newest that fit (the same ranking as over those alone), holds within the bound as more
    come; the first search reads them ``LOAD_VECTORS`` at a time, a later one only what was
    written since the last."""
    width, rng = 32, np.random.default_rng(35)

    def add(store: Store, start: int, count: int) -> None:
        rows = [
            IndexedMessage("s", i, "user", f"message {i}", digest=f"d{i}")
            for i in range(start, start + count)
        ]
        store.index_messages("u", rows, [row.content for row in rows])
        found = store.indexed_since(0, user_id="u", session_id="s")[start:]
        vectors = rng.standard_normal((count, width)).astype("<f4")
        store.store_vectors(
            "m", [(m.id, v.tobytes()) for (m, _), v in zip(found, vectors, strict=True)]
        )

    with Store(str(tmp_path / "m.db")) as store:
        add(store, 0, 200)
        cap = 100 * (4 * width + 21) + 2_000  # about 100 rows
        cache = VectorCache(store, "m", max_bytes=cap)
        monkeypatch.setattr(dense_recall, "LOAD_VECTORS", 64)
        reads: list[int] = []
        since = store.vectors_since
        store.vectors_since = lambda after, **where: reads.append(after) or since(after, **where)  # type: ignore[method-assign]
        query = rng.standard_normal(width).astype(np.float32)
        ask = Ask("q", "other", "u", 10_000)
        ranked = cache.ranked(query, ask)
        held = cache.memory()
        assert 50 <= held["vectors"] < 200 and held["vectors_left_out"] == 200 - held["vectors"]
        assert held["vectors_bytes"] <= cap
        every = since(0, user_id="u", session_id="", model="m")
        newest = every[-held["vectors"] :]
        matrix = np.stack([np.frombuffer(row.vector, dtype="<f4") for row in newest])
        cosine = matrix @ query / np.linalg.norm(matrix, axis=1) / np.linalg.norm(query)
        assert ranked == [newest[i].id for i in np.argsort(-cosine)[: len(ranked)]]
        # this session's rows without a user (none), then the user's, 64 at a time
        assert reads[:5] == [0, 0, *(every[k].seq for k in (63, 127, 191))]
        assert cache.ranked(query, ask) == ranked and reads[-1] == every[-1].seq  # nothing new
        add(store, 200, 60)
        again = cache.ranked(query, ask)
        assert cache.memory()["vectors_bytes"] <= cap and reads[-1] == every[-1].seq
        assert set(again) <= {
            row.id for row in since(0, user_id="u", session_id="", model="m")[-held["vectors"] :]
        }


def test_a_search_reads_new_vectors_by_scope_and_write_order(tmp_path: Path) -> None:
    """The read of what was written since a search's last one goes by an index on the scope
    and the write number (by the scope alone it read every row of the user: a search's cost
    grew with the history)."""
    with Store(str(tmp_path / "m.db")) as store:
        statements: list[str] = []
        store.db.conn.set_trace_callback(statements.append)
        store.vectors_since(7, user_id="u", session_id="", model="m")
        store.vectors_since(7, user_id=None, session_id="s", model="m")
        store.db.conn.set_trace_callback(None)
        reads = [sql for sql in statements if "embedded >" in sql]
        assert len(reads) == 2
        for sql in reads:
            plan = " ".join(str(row) for row in store.db.execute(f"EXPLAIN QUERY PLAN {sql}"))
            assert "_key=? AND embedded>?)" in plan, plan
