"""Pure decisions over a view (docs/design.md §4, §4b, §5, §8): which oversized message to
show as a preview (``reduce``), which old tool results to trim (``trim``), where to cut for a
compaction (``cut``), and the ceiling's rungs when the view is over B (``ceiling``).
Nothing here touches the store or a session: the engine applies what they decide."""
