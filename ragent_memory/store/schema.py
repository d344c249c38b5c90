"""The SQLite schema: the ``compactions`` columns (DESIGN §10) and the migrations."""

from __future__ import annotations

import re

_COMPACTION_COLUMN_NAMES = """id session_id user_id generation status reason model attempts
    material_messages material_chars summary_chars chars_before chars_after duration_ms summary
    error created_at identifiers_kept identifiers_lost written_by covered_from covered_to"""
COMPACTION_COLUMNS = tuple(_COMPACTION_COLUMN_NAMES.split())

# A search reads the vectors written since its last read (``vectors_since``): by the user's
# (or session's) rows alone the planner read every row of the scope, a scan growing with the
# history (31 ms a search at 20,000 messages); by scope and write order it reads only what is
# new. The same statements on PostgreSQL (pg_schema.py).
VECTORS_BY_SCOPE = """
CREATE INDEX recall_messages_user_embedded ON recall_messages (user_id, embedded);
CREATE INDEX recall_messages_session_embedded ON recall_messages (session_id, embedded);
"""

# One row per ``prepare`` of a session (store/turns.py): what the page's chart draws. Bounded per
# session (``turns.TURNS_KEPT``) and dropped with the session. ``covered_from``/``covered_to``:
# the raw indexes [from, to) an audited compaction summarized (0, 0 on rows written before).
TURNS = """
CREATE TABLE turns (
    session_id TEXT NOT NULL,
    turn INTEGER NOT NULL,
    user_id TEXT,
    messages INTEGER NOT NULL,
    chars_raw INTEGER NOT NULL,
    chars_in INTEGER NOT NULL,
    chars_out INTEGER NOT NULL,
    budget_chars INTEGER NOT NULL,
    trimmed INTEGER NOT NULL,
    truncated INTEGER NOT NULL,
    reclaimed_chars INTEGER NOT NULL,
    compacted INTEGER NOT NULL,
    skipped_reason TEXT,
    generation INTEGER NOT NULL,
    covered INTEGER NOT NULL,
    dropped_turns INTEGER NOT NULL,
    recalled_chars INTEGER NOT NULL,
    memory_chars INTEGER NOT NULL,
    created_at TEXT NOT NULL,
    PRIMARY KEY (session_id, turn)
);
ALTER TABLE compactions ADD COLUMN covered_from INTEGER NOT NULL DEFAULT 0;
ALTER TABLE compactions ADD COLUMN covered_to INTEGER NOT NULL DEFAULT 0;
"""

MIGRATIONS: tuple[tuple[str, str], ...] = (
    (
        "001_core",
        """
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE compactions (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            session_id TEXT NOT NULL,
            user_id TEXT,
            generation INTEGER NOT NULL,
            status TEXT NOT NULL CHECK (status IN ('applied', 'failed', 'invalidated')),
            reason TEXT,
            model TEXT,
            attempts INTEGER NOT NULL DEFAULT 0,
            material_messages INTEGER NOT NULL DEFAULT 0,
            material_chars INTEGER NOT NULL DEFAULT 0,
            summary_chars INTEGER NOT NULL DEFAULT 0,
            chars_before INTEGER NOT NULL DEFAULT 0,
            chars_after INTEGER NOT NULL DEFAULT 0,
            duration_ms INTEGER NOT NULL DEFAULT 0,
            summary TEXT,
            error TEXT,
            created_at TEXT NOT NULL
        );
        CREATE UNIQUE INDEX compactions_applied_generation
            ON compactions (session_id, generation) WHERE status = 'applied';
        CREATE INDEX compactions_session ON compactions (session_id, id);
        CREATE TABLE sessions (
            session_id TEXT PRIMARY KEY,
            user_id TEXT,
            generation INTEGER NOT NULL DEFAULT 0,
            last_generation INTEGER NOT NULL DEFAULT 0,
            summary TEXT NOT NULL DEFAULT '',
            body TEXT NOT NULL DEFAULT '',
            prefix_len INTEGER NOT NULL DEFAULT 0,
            covered INTEGER NOT NULL DEFAULT 0,
            covered_digest TEXT NOT NULL DEFAULT '',
            verbatim TEXT NOT NULL DEFAULT '[]',
            updated_at TEXT NOT NULL
        );
        CREATE TABLE substitutions (
            session_id TEXT NOT NULL,
            digest TEXT NOT NULL,
            kind TEXT NOT NULL CHECK (kind IN ('trim', 'truncate')),
            ref TEXT NOT NULL,
            message TEXT NOT NULL,
            created_at TEXT NOT NULL,
            PRIMARY KEY (session_id, digest)
        );
        CREATE TABLE offloads (
            session_id TEXT NOT NULL,
            ref TEXT NOT NULL,
            sha256 TEXT NOT NULL,
            content TEXT NOT NULL,
            chars INTEGER NOT NULL,
            created_at TEXT NOT NULL,
            expires_at TEXT NOT NULL,
            PRIMARY KEY (session_id, ref)
        );
        CREATE INDEX offloads_expiry ON offloads (expires_at);
        """,
    ),
    (
        "002_dropped_sessions",
        """
        CREATE TABLE dropped_sessions (session_id TEXT PRIMARY KEY, dropped_at TEXT NOT NULL);
        DELETE FROM meta WHERE key LIKE 'dropped:%';
        """,
    ),
    (
        "003_long_term_memory",
        """
        CREATE TABLE memories (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            user_id TEXT NOT NULL,
            kind TEXT NOT NULL CHECK (kind IN ('fact', 'summary')),
            content TEXT NOT NULL,
            status TEXT NOT NULL
                CHECK (status IN ('active', 'superseded', 'retracted', 'evicted')),
            session_id TEXT,
            generation INTEGER,
            superseded_by INTEGER REFERENCES memories (id),
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL
        );
        CREATE INDEX memories_user ON memories (user_id, kind, status, id);
        CREATE VIRTUAL TABLE memory_fts USING fts5 (
            terms, excerpt UNINDEXED, user_id UNINDEXED, session_id UNINDEXED,
            tokenize = 'unicode61 remove_diacritics 2'
        );
        CREATE TABLE memory_pending (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            user_id TEXT NOT NULL,
            session_id TEXT NOT NULL,
            raw_index INTEGER NOT NULL,
            digest TEXT NOT NULL,
            content TEXT NOT NULL,
            attempts INTEGER NOT NULL DEFAULT 0,
            created_at TEXT NOT NULL
        );
        CREATE INDEX memory_pending_user ON memory_pending (user_id, id);
        CREATE TABLE memory_cursors (
            user_id TEXT NOT NULL,
            session_id TEXT NOT NULL,
            seen INTEGER NOT NULL,
            last_digest TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            PRIMARY KEY (user_id, session_id)
        );
        CREATE TABLE memory_seen (
            user_id TEXT NOT NULL,
            session_id TEXT NOT NULL,
            digest TEXT NOT NULL,
            PRIMARY KEY (user_id, session_id, digest)
        ) WITHOUT ROWID;
        CREATE TABLE memory_versions (user_id TEXT PRIMARY KEY, version INTEGER NOT NULL);
        INSERT OR IGNORE INTO meta (key, value) VALUES ('memory_seq', '0');
        """,
    ),
    (
        # The key is position + digest (see records.substitution_key), not a bare digest.
        "004_substitution_key",
        "ALTER TABLE substitutions RENAME COLUMN digest TO key;",
    ),
    (
        # Many hosts (store/hosts.py): compaction leases, and who wrote a session last.
        "005_hosts",
        """
        CREATE TABLE compaction_leases (
            session_id TEXT PRIMARY KEY,
            owner TEXT NOT NULL,
            expires_at TEXT NOT NULL
        );
        CREATE TABLE session_writes (
            session_id TEXT PRIMARY KEY,
            writer TEXT NOT NULL,
            stamp INTEGER NOT NULL
        );
        """,
    ),
    (
        "006_recall_index",
        """
        CREATE TABLE recall_messages (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            user_id TEXT,
            session_id TEXT NOT NULL,
            position INTEGER NOT NULL,
            role TEXT NOT NULL,
            content TEXT NOT NULL,
            dated TEXT NOT NULL DEFAULT '',
            digest TEXT NOT NULL,
            created_at TEXT NOT NULL,
            UNIQUE (session_id, position, digest)
        );
        CREATE INDEX recall_messages_user ON recall_messages (user_id);
        CREATE VIRTUAL TABLE recall_fts USING fts5 (
            terms, scope, tokenize = 'porter unicode61 remove_diacritics 2'
        );
        """,
    ),
    (
        # Preserved tool outputs (DESIGN §6): the latest result of each, carried verbatim.
        "007_preserved",
        "ALTER TABLE sessions ADD COLUMN preserved TEXT NOT NULL DEFAULT '[]';",
    ),
    (
        # The retention check (DESIGN §6): identifiers a summary kept and lost.
        "008_identifiers",
        """
        ALTER TABLE compactions ADD COLUMN identifiers_kept INTEGER NOT NULL DEFAULT 0;
        ALTER TABLE compactions ADD COLUMN identifiers_lost INTEGER NOT NULL DEFAULT 0;
        """,
    ),
    (
        # Who wrote an applied summary: the model, the offline summarizer as configured, or
        # the offline summarizer standing in for a model that failed (DESIGN §6, §10).
        "009_written_by",
        "ALTER TABLE compactions ADD COLUMN written_by TEXT NOT NULL DEFAULT '';",
    ),
    (
        # Optional dense recall (DESIGN §9b, store/vectors.py): each row's embedding (float32,
        # little-endian), the model that made it, and the order vectors were written in.
        "010_recall_vectors",
        """
        ALTER TABLE recall_messages ADD COLUMN embedding BLOB;
        ALTER TABLE recall_messages ADD COLUMN embedding_model TEXT;
        ALTER TABLE recall_messages ADD COLUMN embedded INTEGER;
        CREATE INDEX recall_messages_embedded ON recall_messages (embedded);
        CREATE INDEX recall_messages_unembedded_user ON recall_messages (user_id)
            WHERE embedded IS NULL;
        CREATE INDEX recall_messages_unembedded_session ON recall_messages (session_id)
            WHERE embedded IS NULL;
        """,
    ),
    ("011_vectors_by_scope", VECTORS_BY_SCOPE),
    # The audit page (ragent_memory/ui): one row per prepare, and the raw messages each
    # generation covered. The same statements on PostgreSQL (pg_schema.py).
    ("013_turns", TURNS),
)

# FTS rows of a summary memory are numbered memory id × this + excerpt number, so they can be
# deleted by rowid range (FTS5 filters on UNINDEXED columns by scanning).
FTS_ROWS_PER_MEMORY = 1024

_CREATED_TABLE = re.compile(r"CREATE (?:VIRTUAL )?TABLE (?:IF NOT EXISTS )?(\w+)", re.IGNORECASE)


def tables_created(migrations: tuple[tuple[str, str], ...]) -> tuple[str, ...]:
    """Every table ``migrations`` create, in the order they create them."""
    return tuple(name for _, sql in migrations for name in _CREATED_TABLE.findall(sql))
