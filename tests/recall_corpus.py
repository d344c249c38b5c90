"""Messages and questions the recall ranking tests share: the same messages go into a SQLite
and a PostgreSQL store, the same questions are asked of both."""

from __future__ import annotations

import random

from ragent_memory.core.records import IndexedMessage
from ragent_memory.recall.index import index_digest
from ragent_memory.recall.rank import rank_candidates
from ragent_memory.store.contract import Backend
from ragent_memory.text.terms import index_terms, search_terms

FIXED = [
    "Dana is painting the kitchen walls blue this weekend.",
    "The refund policy allows returns within thirty days of delivery.",
    "她上周去北京参加了马拉松比赛，跑得很快。",
    "北京的天气很冷，我们讨论了退款政策。",
    "Ticket 4711: the delivery was delayed because of the storm.",
    "Running every morning keeps him happy; he ran the Boston marathon twice.",
]
WORDS = [
    "refund",
    "delivery",
    "painting",
    "kitchen",
    "marathon",
    "running",
    "storm",
    "ticket",
    "lake",
    "garden",
    "violin",
    "teacher",
    "bakery",
    "invoice",
    "parcel",
    "kettle",
    "museum",
    "harbour",
    "train",
    "bicycle",
    "recipe",
    "concert",
    "hospital",
    "passport",
    "wedding",
    "puppy",
    "lantern",
    "meadow",
]
FILLER = [
    "i",
    "think",
    "that",
    "was",
    "really",
    "great",
    "and",
    "we",
    "should",
    "talk",
    "about",
    "it",
    "again",
    "soon",
]
QUESTIONS = [
    "painting the kitchen walls",
    "refund delivery policy",
    "marathon running happy",
    "北京马拉松",
    "退款 delivery 4711",
    "violin teacher at the museum",
    "parcel kettle invoice refund",
    "wedding passport train harbour",
    "puppy",
    "really great talk soon",  # words in most rows: the mirror reads them by blocks
    "nothing here matches zyzzyva",
]
Hit = tuple[str, int, float]  # session, position, score


def corpus() -> dict[tuple[str | None, str], list[str]]:
    """Seeded messages per (user, session): ann's three sessions, bob's one, and rows of
    ann's session s2 indexed without a user (a search of ann's from s2 must see them). Common
    words reach past a few dozen rows, so the mirror ranks with its block bounds."""
    rng = random.Random(46)

    def message() -> str:
        words = rng.sample(WORDS, rng.randint(1, 4)) + rng.sample(FILLER, rng.randint(2, 8))
        rng.shuffle(words)
        return " ".join(words)

    return {
        ("ann", "s1"): FIXED[:3] + [message() for _ in range(120)],
        ("ann", "s2"): FIXED[3:] + [message() for _ in range(80)],
        (None, "s2"): [message() for _ in range(15)],
        ("ann", "s3"): [message() for _ in range(60)],
        ("bob", "s4"): [message() for _ in range(50)],
    }


def fill(store: Backend) -> None:
    """The same messages, in the same order, into ``store``."""
    for (user, session), texts in corpus().items():
        start = 1_000 if user is None else 0  # rows without a user after the session's own
        rows = [
            IndexedMessage(session, start + i, "user", text, "", index_digest("user", text))
            for i, text in enumerate(texts)
        ]
        store.index_messages(user, rows, [index_terms(text) for text in texts])


def hits(found: list[IndexedMessage]) -> list[Hit]:
    return [(m.session_id, m.position, m.score) for m in found]


def from_store(store: Backend, question: str, **where: object) -> list[Hit]:
    """The hits ranked from the store's candidates (the path a search takes without the
    mirror: a unit too large to keep, or a session with rows indexed without a user)."""
    where = {"visible_from": 1 << 62, "shown": (), **where}
    return hits(rank_candidates(store, search_terms(question), limit=40, **where))  # type: ignore[arg-type]
