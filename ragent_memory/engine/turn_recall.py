"""A turn's recall block (docs/design.md §9b): excerpts of what the view no longer shows, for the
current turn's user message, in the room the view leaves (``recall_max_chars`` caps it) and
never past B."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

from ragent_memory.core.provenance import Markers
from ragent_memory.engine.raw import RawCache
from ragent_memory.engine.sticky import PART_SEPARATOR, Sticky
from ragent_memory.engine.view import HistoryIndex, View
from ragent_memory.gates.ceiling import TRIM_HEADROOM, current_turn_start
from ragent_memory.recall.recaller import Recaller
from ragent_memory.settings import Settings
from ragent_memory.store import id_key

# Earlier turns' kept recall blocks are taken off (all at once, a prefix change) only when
# they would leave the new turn's block less than this share of ``recall_floor_chars``: below
# it the question loses more than the cache gains.
ROOM_SHARE = 0.5


def stamp(epoch: str | None, user_id: str | None) -> str | None:
    """What a kept recall block was found under: the store's recall deletion epoch and the
    user whose sessions were searched (a fixed-width key of the id; None: the store could not
    say)."""
    if epoch is None:
        return None
    return f"{epoch}:{id_key(user_id).hex() if user_id is not None else '-'}"


def block_chars(view: View, raw_sizes: Sequence[int]) -> int:
    """What the view's kept recall blocks add to the messages they ride on."""
    if not view.counts.get("recall"):
        return 0
    kept = sorted(view.indexes("recall"))
    return sum(view.sizes[i] for i in kept) - sum(view.raw_sizes_shown(raw_sizes, kept))


def sizes_as_written(view: View, raw_sizes: Sequence[int]) -> Sequence[int]:
    """The view's sizes without the kept recall blocks: blocks count against B but
    never bring a compaction on (they are recall's, not the conversation's)."""
    if not view.counts.get("recall"):
        return view.sizes
    written = list(view.sizes)
    kept = sorted(view.indexes("recall"))
    for index, size in zip(kept, view.raw_sizes_shown(raw_sizes, kept), strict=True):
        written[index] = size
    return written


def hidden(view: View) -> tuple[range, frozenset[int]]:
    """Raw indexes the view no longer shows as written: those covered by the summary, and
    those shown as a placeholder or preview (a message carrying a recall block is still
    shown as written)."""
    substituted = view.history_indexes(i for i, k in view.kinds.items() if k != "recall")
    return view.covered(), frozenset(substituted)


def tool_loop_reserve(view: View, settings: Settings) -> int:
    """What the block leaves free for the turn's tool loops: twice what the previous turn's
    took (its tool calls and results as shown), at most the ceiling's headroom (10% of B). A
    block filling the view up to B would put the turn's next model call, after its first tool
    result, over B, and the ceiling would then take the kept blocks off in the middle of the
    tool loop (a prefix change with no trim)."""
    messages, sizes = view.messages, view.sizes
    taken = 0
    for index in range(len(messages) - 2, view.head - 1, -1):  # back to the previous question
        message = messages[index]
        if message.get("role") == "user":
            break
        if message.get("role") == "tool" or message.get("tool_calls"):
            taken += sizes[index]
    return min(2 * taken, int(settings.context_window_chars * TRIM_HEADROOM))


class TurnRecall:
    """The block for the current turn: found when the last message is the user's, then kept
    on that message (``keep``) as a sticky substitution, so every later call of the session
    sends the same bytes before its own user message (a provider's prompt cache keeps
    hitting). A kept recall block counts in the view like any message, and leaves it at a trim
    event, when old blocks grow to a fifth of an over-trigger view, when the ceiling needs
    the room, when a compaction covers its message, or when something is forgotten (the
    store's recall deletion epoch it was found under has passed). ``block`` and ``at`` hold
    a block the view could not keep, which the engine then puts on its copy for this call
    alone."""

    def __init__(
        self, session_id: str, settings: Settings, raw: RawCache, recaller: Recaller | None
    ) -> None:
        self.session_id = session_id
        self.settings = settings
        self.raw = raw
        self.recaller = recaller
        self.markers = Markers.from_settings(settings)  # the question is the user's words
        self.block = ""
        self.at = HistoryIndex(-1)
        self.stamp: str | None = None  # what ``block`` was found under (``stamp``)

    def room(self, view: View) -> int:
        """What the block may take: at most ``recall_max_chars`` (past a session's first turn,
        at most ``recall.turn_chars`` too), and B less what the view sends and the tool-loop
        reserve. The block is its own text part before the question; a consumer that reads
        the message as one text (LangChain's OpenAI conversion, many providers) joins the
        parts with a newline, so that char is part of what the block takes of B."""
        settings = self.settings
        free = settings.context_window_chars - view.total - len(PART_SEPARATOR)
        cap, later = settings.recall_max_chars, settings.recall.turn_chars
        if later is not None and not self.first_turn():
            cap = min(cap, later)
        return min(cap, free - tool_loop_reserve(view, settings))

    def first_turn(self) -> bool:
        """Whether this is a session's first turn: the caller's history holds nothing of the
        conversation before its last message (system or developer messages only). Such a
        session has no cached conversation for a large block to displace, and its user's
        earlier sessions are all the context there is: a block that large once a session
        costs the cache once, where one every turn would cost it every turn."""
        raw = self.raw.messages  # read up to the first other message (no copy of the history)
        before = itertools.islice(raw, len(raw) - 1)
        return all(message.get("role") in ("system", "developer") for message in before)

    def crowded(self, total: int) -> bool:
        """Whether kept blocks in a view sending ``total`` leave the new turn's block less
        than ``ROOM_SHARE`` of ``recall_floor_chars`` (the tool-loop reserve aside: it sizes
        the block, it takes no blocks off)."""
        free = self.settings.context_window_chars - total - len(PART_SEPARATOR)
        room = min(self.settings.recall_max_chars, free)
        return room < self.settings.recall_floor_chars * ROOM_SHARE

    def searches(self, view: View) -> bool:
        """Whether ``recall`` will search for this call's last message: a user message (in
        the history and the view) that carries no block yet, recall on."""
        raw = self.raw.messages
        if self.recaller is None or not self.settings.recall_enabled or not raw:
            return False
        if raw[-1].get("role") != "user" or not view.messages:
            return False
        if view.messages[-1].get("role") != "user":
            return False
        return view.kinds.get(view.view_index(HistoryIndex(len(raw) - 1))) != "recall"

    def crowds(self, view: View) -> Callable[[int], bool]:
        """For a compaction planned on ``view``: whether the view it leaves, sending the
        given total, is one whose kept blocks this call's recall would take off (``crowded``
        and a search due). The session takes them off as the compaction applies, so what
        its audit predicts is what the turn sends."""
        searches = self.searches(view) and bool(view.counts.get("recall"))
        return lambda total: searches and self.crowded(total)

    def squeezed(self, view: View) -> bool:
        """Whether this call must take the earlier turns' kept blocks off to leave the new
        turn's block its room: the last message is a user message not searched yet and the
        blocks leave it less than ``ROOM_SHARE`` of ``recall_floor_chars``, and no compaction is
        due. The session then makes it one event with gate 1's pending trims (the prefix
        changes there anyway)."""
        if not view.counts.get("recall") or not self.searches(view):
            return False
        settings = self.settings
        trigger = min(settings.compact_trigger_chars, settings.context_window_chars)
        written = view.with_left_out - block_chars(view, self.raw.sizes)
        if settings.summary_enabled and written > trigger:
            return False  # a compaction is due (a prefix change): they go when it applies
        return self.crowded(view.total)

    def applied(self, view: View, sticky: Sticky) -> None:
        """A compaction applied in this call (the prefix changed): the kept blocks of the
        view it left go too when they crowd this turn's block (``crowds`` predicted it)."""
        if view.counts.get("recall") and self.searches(view) and self.crowded(view.total):
            sticky.drop_recall_blocks(view, sorted(view.indexes("recall")))

    def recall(
        self, view: View, user_id: str | None, summary: str, sticky: Sticky, *, changed: bool
    ) -> tuple[int, int]:
        """The block for the turn whose user message is last (searched once: a call that
        sends the same user message again shows the block kept on it); the kept blocks of
        an epoch that has passed are taken off first. ``changed``: this call changes the
        prefix already (``Turn.changed_prefix``). The block is not part of the view yet (it
        never makes this call's view reach the compaction trigger). Returns (excerpts
        found, their chars)."""
        self.block, self.at, self.stamp = "", HistoryIndex(-1), None
        recaller, raw = self.recaller, self.raw.messages
        if recaller is None or not self.settings.recall_enabled or not raw or not view.messages:
            return 0, 0
        at = HistoryIndex(len(raw) - 1)
        if raw[-1].get("role") != "user" or view.messages[-1].get("role") != "user":
            if view.counts.get("recall"):
                self._forgotten(view, sticky, stamp(recaller.epoch(), user_id))
            return 0, 0
        if view.kinds.get(view.view_index(at)) == "recall":  # this turn's, sent again
            self._forgotten(view, sticky, stamp(recaller.epoch(), user_id))
            if view.kinds.get(view.view_index(at)) == "recall":
                return 0, 0
        if view.counts.get("recall") and self.crowded(view.total) and changed:
            # Earlier turns' blocks are taken off, all at once, when they squeeze this turn's hard
            # (``squeezed`` and ``applied`` made it one event with a trim or a compaction). When a
            # compaction is due but did not apply (written in the background, a slow model) they
            # wait for a call that changes the prefix anyway (a trim, a rung of the ceiling, the
            # compaction once it lands): until then this turn's block has the room they leave.
            sticky.drop_recall_blocks(view, sorted(view.indexes("recall")))
        room = self.room(view)
        if room <= 0:
            return 0, 0
        covered, substituted = hidden(view)
        found = recaller.block(
            self.session_id,
            user_id,
            self.markers.user_text(raw[at]),
            visible_from=covered.stop,
            shown=substituted,
            max_chars=room,
            known_text=summary,
        )
        self.stamp = stamp(recaller.searched_epoch(), user_id)
        if view.counts.get("recall"):
            self._forgotten(view, sticky, self.stamp)
        self.block, self.at = found.text, at
        return found.excerpts, len(found.text)

    def keep(self, view: View, sticky: Sticky) -> None:
        """Put this turn's block on its user message in ``view`` (the session's, which the
        next call extends) for good; left for the engine's copy when it cannot."""
        at, found_under = view.view_index(self.at), self.stamp
        if not self.block or found_under is None or at in view.kinds or at >= len(view.messages):
            return
        if sticky.keep_recall_block(view, at, self.block, found_under):
            self.block, self.at = "", HistoryIndex(-1)

    @staticmethod
    def evict_earlier(view: View, sticky: Sticky) -> None:
        """Earlier turns' blocks are taken off their messages, all at once (at a trim event, which
        changes the prefix anyway): between events the bytes before the current turn stay."""
        if view.counts.get("recall"):
            turn_start = current_turn_start(view.messages, view.head)
            sticky.drop_recall_blocks(
                view, sorted(i for i in view.indexes("recall") if i < turn_start)
            )

    @staticmethod
    def _forgotten(view: View, sticky: Sticky, now: str | None) -> None:
        """Kept recall blocks found under another ``stamp`` are taken off: for another user
        (what they show is not this one's), or under another deletion epoch (what they show
        may have been forgotten since); None: the store cannot say now, they stay."""
        if now is None:
            return
        kept = sorted(view.indexes("recall"))
        stale = [
            index
            for index, at in zip(kept, view.history_indexes(kept), strict=True)
            if (sub := sticky.at(at, view.prefix_len)) is None or sub.ref != now
        ]
        sticky.drop_recall_blocks(view, stale)
