"""The ``ragent-memory`` command line. The only place that configures logging and turns
errors into exit codes (user errors: exit 2, one line, no traceback)."""

from __future__ import annotations

import json
import logging
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal

import attrs
import click
import structlog

from ragent_memory.core.logs import EVENT_ATTR, ROOT
from ragent_memory.core.names import AuditStatus, WrittenBy
from ragent_memory.errors import ConfigError, RagentMemoryError, StoreError
from ragent_memory.settings import (
    MIN_SECRET_CHARS,
    Settings,
    StoreSettings,
    env_value,
    load_settings,
)

if TYPE_CHECKING:
    from ragent_memory.mcp import Speaker
    from ragent_memory.store import Backend, HostMeta

DEFAULT_CONFIG = "config/ragent-memory.yaml"


class _EventFormatter(logging.Formatter):
    """Render the library's events (docs/design.md §13) for a terminal or as JSON lines."""

    def __init__(self, as_json: bool) -> None:
        super().__init__()
        self._render: Any = (
            structlog.processors.JSONRenderer() if as_json else structlog.dev.ConsoleRenderer()
        )

    def format(self, record: logging.LogRecord) -> str:
        fields = dict(getattr(record, EVENT_ATTR, None) or {"event": record.getMessage()})
        stamp = datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")
        event = {"timestamp": stamp, "level": record.levelname.lower(), **fields}
        return str(self._render(None, record.levelname.lower(), event))


def _configure_logging(as_json: bool, verbose: bool) -> None:
    """The app side of §13: the library logs to ``logging``; the CLI shows it on stderr."""
    logger = logging.getLogger(ROOT)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_EventFormatter(as_json))
    logger.handlers = [h for h in logger.handlers if isinstance(h, logging.NullHandler)]
    logger.addHandler(handler)
    logger.setLevel(logging.INFO if verbose else logging.WARNING)
    logger.propagate = False


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn library and input errors into one line on stderr and exit code 2."""
    try:
        yield
    except (RagentMemoryError, ValueError, OSError) as err:
        click.echo(f"error: {err}", err=True)
        sys.exit(2)
    except click.ClickException as err:
        click.echo(f"error: {err.format_message()}", err=True)
        sys.exit(2)


def _settings(config: str | None, db: str | None = None) -> Settings:
    if config is None and Path(DEFAULT_CONFIG).is_file():
        config = DEFAULT_CONFIG
    settings = load_settings(config) if config else Settings()
    if db is not None:
        settings = attrs.evolve(settings, store=StoreSettings(path=db))
    return settings


def _json_wanted(as_json: bool) -> bool:
    """``--json`` after the subcommand, or the group's ``--json`` before it."""
    root = click.get_current_context().find_root()
    return as_json or bool(root.params.get("as_json"))


def _table(rows: list[list[str]], headers: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]
    line = "  ".join(f"{{:<{w}}}" for w in widths)
    out = [line.format(*headers), line.format(*("-" * w for w in widths))]
    out += [line.format(*map(str, r)) for r in rows]
    return "\n".join(out)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--json", "as_json", is_flag=True, help="JSON: log lines on stderr, and tables as JSON."
)
@click.option("-v", "--verbose", is_flag=True, help="Log engine events (info level).")
@click.version_option(package_name="ragent-memory")
def cli(as_json: bool, verbose: bool) -> None:
    """ragent-memory: keep an agent's prompt inside one character budget."""
    _configure_logging(as_json, verbose)


def main(argv: Sequence[str] | None = None) -> None:
    """The console entry point: usage errors, like every user error, are one line and exit 2
    (click's own handling would print a usage block)."""
    try:
        cli.main(args=argv, prog_name="ragent-memory", standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as err:
        click.echo(err.ctx.get_help() if err.ctx else err.format_message())
    except click.UsageError as err:
        hint = f" (see {err.ctx.command_path} --help)" if err.ctx else ""
        click.echo(f"error: {err.format_message()}{hint}", err=True)
        sys.exit(2)
    except click.ClickException as err:
        click.echo(f"error: {err.format_message()}", err=True)
        sys.exit(2)
    except click.Abort:
        click.echo("aborted", err=True)
        sys.exit(1)


@cli.command()
@click.option("--config", type=click.Path(), help=f"YAML config (default {DEFAULT_CONFIG}).")
@click.option("--json", "as_json", is_flag=True, help="Print the numbers as JSON.")
def inspect(config: str | None, as_json: bool) -> None:
    """Print the gates derived from context_window_chars."""
    with user_errors():
        settings = _settings(config)
    derived = settings.derived()
    if _json_wanted(as_json):
        click.echo(json.dumps(derived, indent=2))
        return
    labels = {
        "context_window_chars": "budget B (context_window_chars)",
        "trim_trigger_chars": "trim gate (50%)",
        "compact_trigger_chars": "compaction gate (80%)",
        "keep_recent_chars": "raw tail kept (20%)",
        "summary_max_chars": "summary max (10%, 1500..6000)",
        "memory_max_chars": "memory block max (0.5%, 1500..6000)",
        "memory_consolidate_chars": "memory consolidation stop (75%)",
        "oversized_tool_result_chars": "oversized tool result (5%, 4000..50000)",
        "recall_max_chars": "recall block max (recall.max_chars, else B)",
        "recall_floor_chars": "recall block floor (20%, 1000..40000)",
    }
    rows = [[labels[k], f"{v:,}"] for k, v in derived.items()]
    click.echo(_table(rows, ["gate", "chars"]))
    click.echo(
        f"\nsummary: {'on' if settings.summary_enabled else 'off'} · long-term memory: "
        f"{'on' if settings.long_term_enabled else 'off'} · evictable tools: "
        f"{', '.join(settings.evictable_tools)} · language: {settings.language} · "
        f"summarizer: {settings.llm.model if settings.llm else 'offline (extractive)'}"
    )


@cli.command()
@click.option("--db", type=click.Path(), help="SQLite store (default: store.path of the config).")
@click.option("--config", type=click.Path(), help="YAML config.")
@click.option("--session", "session_id", help="Only this session.")
@click.option("--scope", help="Only this proxy scope (`ragent-memory scope` prints a key's).")
@click.option("--json", "as_json", is_flag=True, help="Print the rows as one JSON array.")
@click.option("--jsonl", "as_jsonl", is_flag=True, help="Print one JSON object per line.")
@click.option("--summaries", is_flag=True, help="Print each applied summary too.")
def audit(
    db: str | None,
    config: str | None,
    session_id: str | None,
    scope: str | None,
    as_json: bool,
    as_jsonl: bool,
    summaries: bool,
) -> None:
    """Print the compaction log (the compactions table)."""
    with user_errors():
        if scope is not None and not _identity().is_scope(scope):
            raise click.ClickException(f"--scope {scope!r}: not a scope (`ragent-memory scope`)")
        with _existing_store(config, db) as store:
            rows = store.compactions(session_id, scope=scope)
    if _json_wanted(as_json):
        click.echo(json.dumps(rows, ensure_ascii=False, indent=2))
        return
    if as_jsonl:
        for row in rows:
            click.echo(json.dumps(row, ensure_ascii=False))
        return
    if not rows:
        click.echo("no compactions recorded")
        return
    cols = ["id", "session_id", "generation", "status", "reason", "model", "written_by"]
    cols += ["attempts", "material_messages", "chars_before", "chars_after", "summary_chars"]
    cols += ["duration_ms", "created_at"]
    click.echo(_table([[r[c] if r[c] is not None else "" for c in cols] for r in rows], cols))
    click.echo("")
    for line in _tally(rows):
        click.echo(line)
    for row in rows:
        if row["error"]:
            click.echo(f"\n#{row['id']} error: {row['error']}")
        if summaries and row["summary"]:
            click.echo(
                f"\n#{row['id']} summary (generation {row['generation']}):\n{row['summary']}"
            )


# Who wrote an applied summary (the audit's written_by), as `audit` counts them.
WRITERS: tuple[tuple[WrittenBy | Literal["unknown"], str], ...] = (
    ("model", "written by the model"),
    ("offline_fallback", "fell back to offline"),
    ("offline", "offline"),
    ("unknown", "not recorded"),
)
# The audit statuses `audit` counts apart from the applied ones.
UNAPPLIED: tuple[AuditStatus, ...] = ("failed", "invalidated")


def _tally(rows: list[dict[str, Any]]) -> list[str]:
    """Per session: the compactions applied, by who wrote them, and those that failed."""
    sessions: dict[str, Counter[str]] = {}
    for row in rows:
        counts = sessions.setdefault(row["session_id"], Counter())
        status = row["status"]
        counts[(row["written_by"] or "unknown") if status == "applied" else status] += 1
    lines = []
    for session_id, counts in sessions.items():
        applied = sum(counts[k] for k in counts if k not in UNAPPLIED)
        parts = [f"{counts[k]} {label}" for k, label in WRITERS if counts[k]]
        line = f"{session_id}: {applied} applied" + (f" ({', '.join(parts)})" if parts else "")
        line += "".join(f", {counts[k]} {k}" for k in UNAPPLIED if counts[k])
        lines.append(line)
    return lines


@cli.command()
@click.argument("file", type=click.Path())
@click.option("--config", type=click.Path(), help="YAML config.")
@click.option(
    "--db",
    type=click.Path(),
    help="SQLite store to keep the session in (default: store.path of --config, else a "
    "fresh temporary store, printed).",
)
@click.option("--session", "session_id", default="cli", show_default=True, help="Session id.")
@click.option("--user", "user_id", default=None, help="User id.")
@click.option("--out", type=click.Path(), help="Write the result JSON here (default stdout).")
def compact(
    file: str,
    config: str | None,
    db: str | None,
    session_id: str,
    user_id: str | None,
    out: str | None,
) -> None:
    """Run the engine over a transcript (JSON array of messages, or JSONL) turn by turn."""
    from ragent_memory.cli.transcript import read_transcript, replay
    from ragent_memory.engine.memory_engine import MemoryEngine

    with user_errors(), tempfile.TemporaryDirectory(prefix="ragent-compact-") as scratch:
        messages = read_transcript(file)
        if db is None and config is None:  # never ./ragent-memory.db by surprise
            db = str(Path(scratch) / "compact.db")
            click.echo(f"store: {db} (temporary; pass --db to keep it)", err=True)
        settings = _settings(config, db)
        path = settings.store.path
        if not settings.store.url and path != ":memory:" and not Path(path).parent.is_dir():
            raise click.ClickException(f"{path}: directory {Path(path).parent} does not exist")
        with MemoryEngine(settings) as engine:
            result = replay(engine, messages, session_id=session_id, user_id=user_id)
        text = json.dumps(result, ensure_ascii=False, indent=2)
        if out:
            Path(out).write_text(text + "\n", encoding="utf-8")
        else:
            click.echo(text)
    last = result["turns"][-1] if result["turns"] else None
    if out and last:
        click.echo(
            f"{len(result['turns'])} turns · final context {last['chars_out']:,} chars "
            f"(history {last['chars_raw']:,}) · generation {last['generation']} → {out}",
            err=True,
        )


@cli.command()
@click.option("--db", type=click.Path(), help="SQLite store (default: store.path of the config).")
@click.option("--config", type=click.Path(), help="YAML config.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object.")
@click.option(
    "--vacuum",
    is_flag=True,
    help="Also rewrite the file to hand all free pages back to the disk (needed once for "
    "stores created before incremental vacuum; takes a write lock while it runs).",
)
def gc(db: str | None, config: str | None, as_json: bool, vacuum: bool) -> None:
    """Delete expired offloads and what is left of dropped sessions; report what was freed."""
    with user_errors(), _existing_store(config, db) as store:
        report = store.gc(vacuum=vacuum)
    sizes = ("file_bytes_before", "file_bytes_after")
    if _json_wanted(as_json):
        fields = attrs.asdict(report)
        click.echo(json.dumps({k: v for k, v in fields.items() if vacuum or k not in sizes}))
        return
    click.echo(
        f"removed {report.expired_offloads} expired offloads and {report.dropped_offloads} "
        f"offloads of {report.dropped_sessions} dropped sessions; "
        f"freed {report.freed_bytes:,} bytes"
    )
    if vacuum:
        click.echo(
            f"database file {report.file_bytes_before:,} → {report.file_bytes_after:,} bytes"
        )


def _existing_store(config: str | None, db: str | None) -> Backend:
    """The store of the config (or ``--db``); never creates an empty SQLite file by accident."""
    from ragent_memory.store import open_store

    settings = _settings(config, db).store
    _require_store(settings)
    return open_store(settings)


def _require_store(settings: StoreSettings) -> None:
    if settings.url is None and (settings.path == ":memory:" or not Path(settings.path).is_file()):
        raise StoreError(f"no store at {settings.path}")


def _identity() -> ModuleType:
    try:
        from ragent_memory.serve import identity
    except ImportError as err:
        raise click.ClickException(
            f"needs the 'serve' extra ({err.name} is missing): pip install 'ragent-memory[serve]'"
        ) from err
    return identity


@cli.command()
@click.option("--key-env", required=True, help="Environment variable holding the API key.")
@click.option("--db", type=click.Path(), help="SQLite store (default: store.path of the config).")
@click.option("--config", type=click.Path(), help="YAML config.")
def scope(key_env: str, db: str | None, config: str | None) -> None:
    """Print the proxy's scope of the API key in variable KEY_ENV (for `audit --scope`)."""
    with user_errors():
        identity = _identity()
        key = env_value("--key-env", key_env)
        secret = _settings(config, db).serve.secret()
        if secret is None:
            with _existing_store(config, db) as store:
                secret = store.scope_secret()
    click.echo(identity.scope_of(secret, key))


@cli.command()
@click.option("--from", "source", required=True, type=click.Path(), help="SQLite store file.")
@click.option("--to", "target", required=True, help="postgresql://user@host/database")
@click.option(
    "--password-env",
    help="Environment variable holding the PostgreSQL password (else libpq's PGPASSWORD).",
)
def migrate(source: str, target: str, password_env: str | None) -> None:
    """Copy a SQLite store into an empty PostgreSQL database (docs/design.md §10, many hosts)."""
    from ragent_memory.store import Store
    from ragent_memory.store.copy import copy_store
    from ragent_memory.store.postgres import PostgresStore

    with user_errors():
        if not Path(source).is_file():
            raise StoreError(f"no store at {source}")
        settings = StoreSettings(url=target, password_env=password_env)  # checks both
        with (
            Store(source) as sqlite,
            PostgresStore(target, password=settings.password()) as postgres,
        ):
            counts = copy_store(sqlite, postgres)
    copied = ", ".join(f"{table} {n}" for table, n in counts.items() if n)
    click.echo(f"copied {sum(counts.values()):,} rows into {target}: {copied or 'nothing'}")


def _user(user_id: str | None) -> str:
    if not user_id:
        raise click.ClickException("--user is required (the user's id)")
    return user_id


@cli.group()
def memory() -> None:
    """Long-term memory: what is remembered about a user, and how to erase it."""


@memory.command("list")
@click.option("--user", "user_id", help="The user's id (required).")
@click.option("--db", type=click.Path(), help="SQLite store (default: store.path of the config).")
@click.option("--config", type=click.Path(), help="YAML config.")
@click.option("--all", "show_all", is_flag=True, help="Also superseded, retracted and evicted.")
@click.option("--json", "as_json", is_flag=True, help="Print the facts as a JSON array.")
def memory_list(
    user_id: str | None, db: str | None, config: str | None, show_all: bool, as_json: bool
) -> None:
    """List the facts remembered about a user (active ones unless --all)."""
    with user_errors():
        user = _user(user_id)
        with _existing_store(config, db) as store:
            rows = store.memory_rows(user, kind="fact")
    if not show_all:
        rows = [r for r in rows if r["status"] == "active"]
    facts = [
        {k: r[k] for k in ("id", "content", "status", "superseded_by", "created_at", "updated_at")}
        for r in rows
    ]
    if _json_wanted(as_json):
        click.echo(json.dumps(facts, ensure_ascii=False, indent=2))
        return
    if not facts:
        click.echo(f"nothing remembered about {user}")
        return
    cols = ["id", *(["status"] if show_all else []), "created_at", "content"]
    click.echo(_table([[f[c] for c in cols] for f in facts], cols))


@memory.command("forget")
@click.option("--user", "user_id", help="The user's id (required).")
@click.option("--db", type=click.Path(), help="SQLite store (default: store.path of the config).")
@click.option("--config", type=click.Path(), help="YAML config.")
def memory_forget(user_id: str | None, db: str | None, config: str | None) -> None:
    """Erase everything remembered about a user: facts, summaries, pending messages."""
    with user_errors():
        user = _user(user_id)
        with _existing_store(config, db) as store:
            forgotten = store.forget(user)
    click.echo(
        f"forgot {user}: {forgotten.memories} memories and {forgotten.pending} pending messages"
    )


@cli.command()
@click.option("--config", type=click.Path(), help="YAML config (default: the built-in demo).")
@click.option("--turns", default=200, show_default=True, type=click.IntRange(1, 5000))
@click.option("--out", "out_dir", default="demo-out", show_default=True, type=click.Path())
@click.option("--db", type=click.Path(), help="SQLite store (default: OUT/demo.db, started fresh).")
@click.option(
    "--chart", type=click.Path(), help="PNG of context size per turn (default: OUT/context.png)."
)
def demo(config: str | None, turns: int, out_dir: str, db: str | None, chart: str | None) -> None:
    """Run a simulated RAG-agent session through the engine, offline, and report each gate."""
    from ragent_memory.cli.demo import run_demo

    with user_errors():
        for path in (db, chart):
            if path is not None and not Path(path).parent.is_dir():
                raise click.ClickException(f"{path}: directory {Path(path).parent} does not exist")
        run_demo(
            config=config,
            turns=turns,
            out_dir=Path(out_dir),
            db_path=Path(db) if db else None,
            chart_path=Path(chart) if chart else None,
        )


@cli.command()
@click.option("--config", type=click.Path(), help=f"YAML config (default {DEFAULT_CONFIG}).")
@click.option(
    "--upstream",
    help="The model's OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1 "
    "(default: serve.upstream of the config).",
)
@click.option("--host", help="Interface to listen on (default: serve.host, 127.0.0.1).")
@click.option("--port", type=int, help="Port (default: serve.port, 8089; 0 picks a free one).")
@click.pass_context
def serve(
    ctx: click.Context, config: str | None, upstream: str | None, host: str | None, port: int | None
) -> None:
    """Run the proxy for chat completions, Anthropic Messages and OpenAI Responses: point an
    app's base URL here, nothing else changes."""
    with user_errors():
        settings = _settings(config)
        given: dict[str, Any] = {"upstream": upstream, "host": host, "port": port}
        section = attrs.evolve(settings.serve, **{k: v for k, v in given.items() if v is not None})
        if not section.upstream:
            raise ConfigError("serve.upstream", "no upstream: pass --upstream URL or set it")
        settings = attrs.evolve(settings, serve=section)
        try:
            from ragent_memory.serve.app import serve as run_proxy
            from ragent_memory.serve.app import shown_url
        except ImportError as err:
            raise click.ClickException(
                f"serve needs the 'serve' extra ({err.name} is missing): "
                "pip install 'ragent-memory[serve]'"
            ) from err
        verbose = bool(ctx.find_root().params.get("verbose"))
        target = shown_url(section.upstream)
        run_proxy(
            settings,
            verbose=verbose,
            ready=lambda url: click.echo(f"ragent-memory serve: {url} → {target}", err=True),
        )


MCP_SESSION = "ragent-memory-mcp/{user}"  # the MCP server's own session (its search refs)


def _host_port(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or int(port) > 65535:
        raise click.ClickException(f"--http {value!r}: expected HOST:PORT, e.g. 127.0.0.1:8090")
    return host, int(port)


def _mcp_token(token_env: str | None, http: str | None) -> str | None:
    """The bearer token ``--token-env`` names (None without it)."""
    if token_env is None:
        return None
    if http is None:
        raise click.ClickException("--token-env: a token guards --http only; stdio needs none")
    token = env_value("--token-env", token_env)
    if len(token) < MIN_SECRET_CHARS:
        raise ConfigError("--token-env", f"{token_env} holds under {MIN_SECRET_CHARS} characters")
    return token


def _mcp_speaker(store: HostMeta, settings: Settings, user: str, key_env: str | None) -> Speaker:
    """Whom the MCP server answers for: ``user`` as given, or with ``key_env`` the ids the
    proxy keeps for that API key (serve/identity.py decides them, as for a request)."""
    from ragent_memory.mcp import Speaker

    session = MCP_SESSION.format(user=user)
    if key_env is None:
        return Speaker(user_id=user, session_id=session)
    identity = _identity()
    if settings.serve.identity != "credential":
        raise click.ClickException(
            f"--key-env: serve.identity is {settings.serve.identity!r}, so the proxy keeps "
            "ids as sent; pass --user alone"
        )
    headers = {"authorization": f"Bearer {env_value('--key-env', key_env)}"}
    headers |= {"x-session-id": session, "x-user-id": user}
    session_id, user_id = identity.Identity(settings.serve, store).identify(headers, {})
    return Speaker(user_id=user_id, session_id=session_id)


@cli.command("mcp")
@click.option("--config", type=click.Path(), help=f"YAML config (default {DEFAULT_CONFIG}).")
@click.option("--db", type=click.Path(), help="SQLite store (default: store.path of the config).")
@click.option("--user", "user_id", help="The user's id, as the app or X-User-Id names it.")
@click.option(
    "--key-env",
    help="Environment variable holding the API key the user's app sends the proxy "
    "(serve.identity: credential): answer from the rows the proxy keeps for that key.",
)
@click.option(
    "--http",
    metavar="HOST:PORT",
    help="Serve streamable HTTP at http://HOST:PORT/mcp instead of stdio (PORT 0: a free one).",
)
@click.option(
    "--token-env",
    metavar="VAR",
    help="With --http: environment variable holding the bearer token every request must send "
    f"({MIN_SECRET_CHARS} characters or more). Without it, --http binds loopback hosts only.",
)
def mcp_command(
    config: str | None,
    db: str | None,
    user_id: str | None,
    key_env: str | None,
    http: str | None,
    token_env: str | None,
) -> None:
    """Serve one user's memory to MCP clients (Claude Desktop, Cursor): search, recall, facts."""
    from ragent_memory.engine.memory_engine import MemoryEngine

    with user_errors():
        user = _user(user_id)
        where = _host_port(http) if http else None
        token = _mcp_token(token_env, http)
        settings = _settings(config, db)
        try:
            from ragent_memory.mcp import run_server
        except ImportError as err:
            raise click.ClickException(
                f"mcp needs the 'mcp' extra ({err.name} is missing): "
                "pip install 'ragent-memory[mcp]'"
            ) from err
        _require_store(settings.store)  # a wrong path is an error, not a new empty store
        with MemoryEngine(settings) as engine:
            speaker = _mcp_speaker(engine.store, settings, user, key_env)
            run_server(
                engine,
                speaker,
                http=where,
                token=token,
                ready=lambda at: click.echo(f"ragent-memory mcp: {at} · user {user}", err=True),
            )


@cli.command()
@click.argument("path", default=DEFAULT_CONFIG, type=click.Path())
@click.option("--force", is_flag=True, help="Overwrite an existing file.")
def init(path: str, force: bool) -> None:
    """Write the documented default config to PATH (default config/ragent-memory.yaml)."""
    from importlib.resources import files

    target = Path(path)
    with user_errors():
        if target.exists() and not force:
            raise click.ClickException(f"{path} already exists (use --force to overwrite)")
        if path == DEFAULT_CONFIG:
            target.parent.mkdir(exist_ok=True)
        elif not target.parent.is_dir():
            raise click.ClickException(f"{path}: directory {target.parent} does not exist")
        shipped = files("ragent_memory") / "data" / "ragent-memory.yaml"
        target.write_text(shipped.read_text(encoding="utf-8"), encoding="utf-8")
    click.echo(f"wrote {path}")
