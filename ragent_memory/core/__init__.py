"""The bottom room: what every other room speaks in (docs/design.md §2, §3, §16).

- ``chars``: a message's size in characters, the one measure of B;
- ``inputs``: the engine's input boundary (chat dicts in, the caller's objects never touched);
- ``names``: the closed sets of names the rooms exchange (skip reasons, audit statuses, kinds),
  each one ``Literal`` type (docs/design.md §16b);
- ``toolloops``: a history split into turns and tool loops;
- ``provenance``: who said a piece of text (the user, the harness, a tool, the assistant);
- ``records``: the frozen records that cross the store contract;
- ``lru``, ``memo``: the one bounded cache (least recently used out past a count or a
  weight) and a function's answers kept in one, thread-safe;
- ``identifiers``, ``alternation``, ``logs``, ``tracing``: identifiers in text, strict role
  alternation, structured events, OpenTelemetry spans when the app traces.
"""
