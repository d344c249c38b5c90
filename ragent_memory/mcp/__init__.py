"""``ragent-memory mcp`` (docs/design.md §14b): one user's memory as Model Context Protocol tools, for
MCP clients (Claude Desktop, Claude Code, Cursor), on the official ``mcp`` SDK (extra ``mcp``).

- :func:`memory_server` builds the server over a ``MemoryEngine``: ``search_memory``,
  ``recall_tool_result``, ``list_facts`` and ``forget_fact``.
- :func:`run_server` serves it over stdio, or streamable HTTP at ``http://HOST:PORT/mcp``
  (every request carrying a bearer token; without one, loopback hosts only).

Which user a server speaks for is decided above it (the CLI applies the proxy's credential
scope, ``serve/identity.py``): this room only ever answers with that one user's rows."""

from ragent_memory.mcp.server import MCP_PATH, Speaker, memory_server, run_server

__all__ = ["MCP_PATH", "Speaker", "memory_server", "run_server"]
