"""The SQLite schema: the ``compactions`` columns (docs/design.md §10) and the migrations."""

from __future__ import annotations

import re
from types import MappingProxyType

_COMPACTION_COLUMN_NAMES = """id session_id user_id generation status reason model attempts
    material_messages material_chars summary_chars chars_before chars_after duration_ms summary
    error created_at identifiers_kept identifiers_lost written_by covered_from covered_to"""
COMPACTION_COLUMNS = tuple(_COMPACTION_COLUMN_NAMES.split())

# A search reads the vectors written since its last read (``vectors_since``): by the user's
# (or session's) rows alone the planner read every row of the scope, a scan growing with the
# history; by scope and write order it reads only what is new. The same statements on PostgreSQL (pg_schema.py).
VECTORS_BY_SCOPE = """
CREATE INDEX recall_messages_user_embedded ON recall_messages (user_id, embedded);
CREATE INDEX recall_messages_session_embedded ON recall_messages (session_id, embedded);
"""

# Session and user ids kept once: every table but ``compactions`` (the audit, read as text)
# holds a 16-byte key (``base.id_key``: the first half of the id's SHA-256) and ``ids`` maps it
# back: a long id stored again in every message row and in six indexes made the store grow
# with the id's length times the rows, for no lookup it helps. Each table is rebuilt (SQLite alters no column type): renamed
# aside, made again, filled with ``id_key`` (a SQL function the store registers), dropped;
# its AUTOINCREMENT counter carried over so no id is handed out twice. Leases start afresh,
# now naming their holder (store/hosts.py).
_KEYED_TABLES = MappingProxyType(
    {
        "sessions": (
            """session_key BLOB PRIMARY KEY, user_key BLOB,
        generation INTEGER NOT NULL DEFAULT 0, last_generation INTEGER NOT NULL DEFAULT 0,
        summary TEXT NOT NULL DEFAULT '', body TEXT NOT NULL DEFAULT '',
        prefix_len INTEGER NOT NULL DEFAULT 0, covered INTEGER NOT NULL DEFAULT 0,
        covered_digest TEXT NOT NULL DEFAULT '', verbatim TEXT NOT NULL DEFAULT '[]',
        preserved TEXT NOT NULL DEFAULT '[]', updated_at TEXT NOT NULL""",
            "id_key(session_id), id_key(user_id), generation, last_generation, summary, body,"
            " prefix_len, covered, covered_digest, verbatim, preserved, updated_at",
        ),
        "substitutions": (
            """session_key BLOB NOT NULL, key TEXT NOT NULL,
        kind TEXT NOT NULL CHECK (kind IN ('trim', 'truncate', 'recall')), ref TEXT NOT NULL,
        message TEXT NOT NULL, created_at TEXT NOT NULL, PRIMARY KEY (session_key, key)""",
            "id_key(session_id), key, kind, ref, message, created_at",
        ),
        "offloads": (
            """session_key BLOB NOT NULL, ref TEXT NOT NULL, sha256 TEXT NOT NULL,
        content TEXT NOT NULL, chars INTEGER NOT NULL, created_at TEXT NOT NULL,
        expires_at TEXT NOT NULL, PRIMARY KEY (session_key, ref)""",
            "id_key(session_id), ref, sha256, content, chars, created_at, expires_at",
        ),
        "dropped_sessions": (
            "session_key BLOB PRIMARY KEY, dropped_at TEXT NOT NULL",
            "id_key(session_id), dropped_at",
        ),
        "memories": (
            """id INTEGER PRIMARY KEY AUTOINCREMENT, user_key BLOB NOT NULL,
        kind TEXT NOT NULL CHECK (kind IN ('fact', 'summary')), content TEXT NOT NULL,
        status TEXT NOT NULL
            CHECK (status IN ('active', 'superseded', 'retracted', 'evicted')),
        session_key BLOB, generation INTEGER, superseded_by INTEGER REFERENCES memories (id),
        created_at TEXT NOT NULL, updated_at TEXT NOT NULL""",
            "id, id_key(user_id), kind, content, status, id_key(session_id), generation,"
            " superseded_by, created_at, updated_at",
        ),
        "memory_pending": (
            """id INTEGER PRIMARY KEY AUTOINCREMENT, user_key BLOB NOT NULL,
        session_key BLOB NOT NULL, raw_index INTEGER NOT NULL, digest TEXT NOT NULL,
        content TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, created_at TEXT NOT NULL""",
            "id, id_key(user_id), id_key(session_id), raw_index, digest, content, attempts, created_at",
        ),
        "memory_cursors": (
            """user_key BLOB NOT NULL, session_key BLOB NOT NULL, seen INTEGER NOT NULL,
        last_digest TEXT NOT NULL, updated_at TEXT NOT NULL,
        PRIMARY KEY (user_key, session_key)""",
            "id_key(user_id), id_key(session_id), seen, last_digest, updated_at",
        ),
        "memory_seen": (
            """user_key BLOB NOT NULL, session_key BLOB NOT NULL, digest TEXT NOT NULL,
        PRIMARY KEY (user_key, session_key, digest)""",
            "id_key(user_id), id_key(session_id), digest",
        ),
        "memory_versions": (
            "user_key BLOB PRIMARY KEY, version INTEGER NOT NULL",
            "id_key(user_id), version",
        ),
        "session_writes": (
            "session_key BLOB PRIMARY KEY, writer TEXT NOT NULL, stamp INTEGER NOT NULL",
            "id_key(session_id), writer, stamp",
        ),
        "recall_messages": (
            """id INTEGER PRIMARY KEY AUTOINCREMENT, user_key BLOB, session_key BLOB NOT NULL,
        position INTEGER NOT NULL, role TEXT NOT NULL, content TEXT NOT NULL,
        dated TEXT NOT NULL DEFAULT '', digest TEXT NOT NULL, created_at TEXT NOT NULL,
        embedding BLOB, embedding_model TEXT, embedded INTEGER,
        UNIQUE (session_key, position, digest)""",
            "id, id_key(user_id), id_key(session_id), position, role, content, dated, digest,"
            " created_at, embedding, embedding_model, embedded",
        ),
    }
)
_AUTOINCREMENT = ("memories", "memory_pending", "recall_messages")
_WITHOUT_ROWID = ("memory_seen",)

# The indexes on key columns, on both backends (PostgreSQL: pg_schema.py).
KEYED_INDEXES = """
CREATE INDEX memories_user ON memories (user_key, kind, status, id);
CREATE INDEX memory_pending_user ON memory_pending (user_key, id);
CREATE INDEX recall_messages_user ON recall_messages (user_key);
CREATE INDEX recall_messages_unembedded_user ON recall_messages (user_key)
    WHERE embedded IS NULL;
CREATE INDEX recall_messages_unembedded_session ON recall_messages (session_key)
    WHERE embedded IS NULL;
CREATE INDEX recall_messages_user_embedded ON recall_messages (user_key, embedded);
CREATE INDEX recall_messages_session_embedded ON recall_messages (session_key, embedded);
"""


def _rebuilt(table: str, columns: str, select: str) -> str:
    """SQL moving ``table`` aside, making it again with ``columns`` and filling it."""
    tail = " WITHOUT ROWID" if table in _WITHOUT_ROWID else ""
    sql = f"""
        ALTER TABLE {table} RENAME TO old_{table};
        CREATE TABLE {table} ({columns}){tail};
        INSERT INTO {table} SELECT {select} FROM old_{table};
        """
    if table in _AUTOINCREMENT:
        sql += f"""
        DELETE FROM sqlite_sequence WHERE name = '{table}';
        UPDATE sqlite_sequence SET name = '{table}' WHERE name = 'old_{table}';
        """
    return sql + f"DROP TABLE old_{table};"


def _id_sources() -> str:
    """SQL keeping every id the old tables hold in ``ids`` (before they are rebuilt)."""
    named = [
        (table, column)
        for table, (_, select) in _KEYED_TABLES.items()
        for column in ("session_id", "user_id")
        if f"id_key({column})" in select
    ]
    return "".join(
        f"INSERT INTO ids (key, value) SELECT DISTINCT id_key({column}), {column}"
        f" FROM {table} WHERE {column} IS NOT NULL ON CONFLICT DO NOTHING;\n"
        for table, column in named
    )


KEYED_IDS = (
    "CREATE TABLE ids (key BLOB PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;\n"
    + _id_sources()
    + "".join(_rebuilt(table, *shape) for table, shape in _KEYED_TABLES.items())
    + """
    ALTER TABLE memory_fts RENAME TO old_memory_fts;
    CREATE VIRTUAL TABLE memory_fts USING fts5 (
        terms, excerpt UNINDEXED, user_key UNINDEXED, session_key UNINDEXED,
        tokenize = 'unicode61 remove_diacritics 2'
    );
    INSERT INTO memory_fts (rowid, terms, excerpt, user_key, session_key)
        SELECT rowid, terms, excerpt, id_key(user_id), id_key(session_id) FROM old_memory_fts;
    DROP TABLE old_memory_fts;
    CREATE INDEX offloads_expiry ON offloads (expires_at);
    CREATE INDEX recall_messages_embedded ON recall_messages (embedded);
    DROP TABLE compaction_leases;
    CREATE TABLE compaction_leases (
        session_key BLOB PRIMARY KEY,
        owner TEXT NOT NULL,
        host TEXT NOT NULL,
        pid INTEGER NOT NULL,
        started TEXT NOT NULL,
        expires_at TEXT NOT NULL
    );
    """
    + KEYED_INDEXES
)

# One row per ``prepare`` of a session (store/turns.py): what the audit page's chart draws.
# Bounded per session (``turns.TURNS_KEPT``) and dropped with the session; keyed like every
# table by the ids' keys. ``covered_from``/``covered_to``: the raw indexes [from, to) an
# audited compaction summarized (0, 0 on rows written before). ``{blob}``: the dialect's
# bytes type.
TURNS_TEMPLATE = """
CREATE TABLE turns (
    session_key {blob} NOT NULL,
    turn INTEGER NOT NULL,
    user_key {blob},
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
    PRIMARY KEY (session_key, turn)
);
ALTER TABLE compactions ADD COLUMN covered_from INTEGER NOT NULL DEFAULT 0;
ALTER TABLE compactions ADD COLUMN covered_to INTEGER NOT NULL DEFAULT 0;
"""
TURNS = TURNS_TEMPLATE.format(blob="BLOB")

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
        # Preserved tool outputs (docs/design.md §6): the latest result of each, carried verbatim.
        "007_preserved",
        "ALTER TABLE sessions ADD COLUMN preserved TEXT NOT NULL DEFAULT '[]';",
    ),
    (
        # The retention check (docs/design.md §6): identifiers a summary kept and lost.
        "008_identifiers",
        """
        ALTER TABLE compactions ADD COLUMN identifiers_kept INTEGER NOT NULL DEFAULT 0;
        ALTER TABLE compactions ADD COLUMN identifiers_lost INTEGER NOT NULL DEFAULT 0;
        """,
    ),
    (
        # Who wrote an applied summary: the model, the offline summarizer as configured, or
        # the offline summarizer standing in for a model that failed (docs/design.md §6, §10).
        "009_written_by",
        "ALTER TABLE compactions ADD COLUMN written_by TEXT NOT NULL DEFAULT '';",
    ),
    (
        # Optional dense recall (docs/design.md §9b, store/vectors.py): each row's embedding (float32,
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
    ("012_keyed_ids", KEYED_IDS),
    # The audit page (ragent_memory/ui): one row per prepare, and the raw messages each
    # generation covered. The same statements on PostgreSQL (pg_schema.py).
    ("013_turns", TURNS),
    # Each recall row's length in tokens, for the recall ranker's statistics: measured when a
    # search first needs it (recall_index.py), found by these partial indexes.
    (
        "014_recall_lengths",
        """
        ALTER TABLE recall_messages ADD COLUMN tokens INTEGER;
        CREATE INDEX recall_messages_unmeasured_user ON recall_messages (user_key)
            WHERE tokens IS NULL;
        CREATE INDEX recall_messages_unmeasured_session ON recall_messages (session_key)
            WHERE tokens IS NULL;
        """,
    ),
)

# FTS rows of a summary memory are numbered memory id × this + excerpt number, so they can be
# deleted by rowid range (FTS5 filters on UNINDEXED columns by scanning).
FTS_ROWS_PER_MEMORY = 1024

_CREATED_TABLE = re.compile(r"CREATE (?:VIRTUAL )?TABLE (?:IF NOT EXISTS )?(\w+)", re.IGNORECASE)


def tables_created(migrations: tuple[tuple[str, str], ...]) -> tuple[str, ...]:
    """Every table ``migrations`` create, in the order they first create them (a table made
    again by a later migration is named once)."""
    names = (name for _, sql in migrations for name in _CREATED_TABLE.findall(sql))
    return tuple(dict.fromkeys(names))
