"""``ragent-memory ui`` (the audit page) and ``ragent-memory probe`` (its fidelity probes on
the command line)."""

from __future__ import annotations

import json
import urllib.parse

import click

from ragent_memory.cli.main import (
    _existing_store,
    _identity,
    _json_wanted,
    _settings,
    _table,
    cli,
    user_errors,
)
from ragent_memory.settings import env_value, is_loopback

DEFAULT_PORT = 8090


@cli.command()
@click.option("--config", type=click.Path(), help="YAML config (its store is the one shown).")
@click.option("--db", type=click.Path(), help="SQLite store (default: store.path of the config).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to listen on.")
@click.option(
    "--port", default=DEFAULT_PORT, show_default=True, type=int, help="Port (0: a free one)."
)
@click.option(
    "--token-env",
    help="Environment variable holding a token every request must carry (needed to listen "
    "beyond loopback).",
)
@click.option("--scope", help="Show only this proxy scope's sessions and users.")
@click.option("--session", "session_id", help="Print this session's page address when ready.")
def ui(
    config: str | None,
    db: str | None,
    host: str,
    port: int,
    token_env: str | None,
    scope: str | None,
    session_id: str | None,
) -> None:
    """Serve the audit page: sessions, context per turn, each compaction and what it kept, a
    user's facts (read-only, but for forgetting one fact)."""
    with user_errors():
        token = env_value("--token-env", token_env) if token_env else None
        if token is None and not is_loopback(host):
            raise click.ClickException(
                f"--host {host}: beyond loopback the page needs --token-env VAR"
            )
        if scope is not None and not _identity().is_scope(scope):
            raise click.ClickException(f"--scope {scope!r}: not a scope (`ragent-memory scope`)")
        try:
            from ragent_memory.ui.app import create_app, serve
        except ImportError as err:
            raise click.ClickException(
                f"ui needs the 'ui' extra ({err.name} is missing): pip install 'ragent-memory[ui]'"
            ) from err
        settings = _settings(config, db)
        with _existing_store(config, db) as store:
            app = create_app(store, settings, scope=scope, token=token)

            def ready(url: str) -> None:
                shown = url
                if session_id is not None:
                    shown = f"{url}session?{urllib.parse.urlencode({'id': session_id})}"
                note = " (append ?token=… once, or send Authorization: Bearer)" if token else ""
                click.echo(f"ragent-memory ui: {shown}{note}", err=True)

            serve(app, host, port, ready)


@cli.command()
@click.option("--session", "session_id", required=True, help="The session to probe.")
@click.option("--config", type=click.Path(), help="YAML config.")
@click.option("--db", type=click.Path(), help="SQLite store (default: store.path of the config).")
@click.option("--json", "as_json", is_flag=True, help="Print every probe as one JSON object.")
def probe(session_id: str, config: str | None, db: str | None, as_json: bool) -> None:
    """Check what each applied compaction of a session kept: every identifier, number, date,
    name and user constraint of the messages it covered, kept in the summary, recallable, or
    lost. Deterministic and offline; a floor, not a judge."""
    from ragent_memory.audit import OUTCOMES, probe_session

    with user_errors():
        settings = _settings(config, db)
        with _existing_store(config, db) as store:
            found = probe_session(store, settings, session_id)
    if _json_wanted(as_json):
        click.echo(json.dumps(found.as_dict(), ensure_ascii=False, indent=2))
        return
    if not found.generations:
        click.echo(f"no applied compaction recorded for session {session_id}")
        return
    headers = ["generation", "messages", "written_by", *OUTCOMES, "note"]
    rows = [
        [
            g.generation,
            f"{g.covered_from}-{g.covered_to - 1}" if g.covered_to > g.covered_from else "",
            g.written_by,
            *(g.counts()[o] for o in OUTCOMES),
            g.note,
        ]
        for g in found.generations
    ]
    click.echo(_table([[str(c) for c in r] for r in rows], headers))
    totals = found.totals()
    click.echo("\n" + ", ".join(f"{totals[o]} {o}" for o in OUTCOMES))
    for g in found.generations:
        for p in g.probes:
            if p.outcome != "kept":
                click.echo(
                    f"  generation {g.generation} {p.outcome}: {p.item!r} (message #{p.position}, {p.role})"
                )
