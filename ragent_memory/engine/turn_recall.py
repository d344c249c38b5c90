"""A turn's recall block (DESIGN §9b): excerpts of what the view no longer shows, for the
current turn's user message, within ``recall_max_chars`` and never past B."""

from __future__ import annotations

from typing import NamedTuple

from ragent_memory.core.provenance import Markers
from ragent_memory.engine.raw import RawCache
from ragent_memory.engine.view import View
from ragent_memory.recall.excerpts import Recalled
from ragent_memory.recall.recaller import Recaller
from ragent_memory.settings import Settings

PART_SEPARATOR = "\n"  # what a consumer that joins a message's text parts puts between them


class _TurnBlock(NamedTuple):
    """The block found for a turn's user message (``at``, a raw index; -1: none yet), and
    what it depends on beyond the view's room: the question, the user whose sessions were
    searched and the store's deletion epoch then (a ``forget`` or ``drop_session`` since, by
    any process, replaces it)."""

    at: int = -1
    text: str = ""
    user_id: str | None = None
    epoch: str | None = None
    found: Recalled = Recalled()


def hidden(view: View) -> tuple[range, frozenset[int]]:
    """Raw indexes the view no longer shows as written: those covered by the summary, and
    those shown as a substitution (placeholder or preview)."""
    covered = range(view.prefix_len, view.head + view.offset)
    return covered, frozenset(i + view.offset for i in view.kinds)


class TurnRecall:
    """The block for the current turn (``block`` at raw index ``at``, which the engine puts on
    its copy: the view itself, kept from turn to turn, never holds it)."""

    def __init__(
        self, session_id: str, settings: Settings, raw: RawCache, recaller: Recaller | None
    ) -> None:
        self.session_id = session_id
        self.settings = settings
        self.raw = raw
        self.recaller = recaller
        self.markers = Markers.from_settings(settings)  # the question is the user's words
        self.block = ""
        self.at = -1
        self._turn = _TurnBlock()  # the same turn's later calls show it again while it fits

    def room(self, view: View) -> int:
        """What the block may take: at most ``recall_max_chars``, and B less what the view
        sends. The block is its own text part before the question; a consumer that reads the
        message as one text (LangChain's OpenAI conversion, many providers) joins the parts
        with a newline, so that char is part of what the block takes of B."""
        settings = self.settings
        free = settings.context_window_chars - view.total - len(PART_SEPARATOR)
        return min(settings.recall_max_chars, free)

    def recall(self, view: View, user_id: str | None, summary: str) -> tuple[int, int]:
        """The block for the final view: searched when the last message is the user's; in
        the turn's tool loop (the last message is a tool result) that turn's block again, on
        the same message, while it fits (cut to its leading excerpts when the loop's results
        left less room), searching nothing: a session without the turn's block (a restart,
        another host) shows none until the next user message. The block is not part of the
        view (it never makes the view reach the compaction trigger). Returns (excerpts
        shown, their chars)."""
        kept, self._turn = self._turn, _TurnBlock()
        self.block, self.at = "", -1
        recaller, raw = self.recaller, self.raw.messages
        if recaller is None or not self.settings.recall_enabled or not raw or not view.messages:
            return 0, 0
        room = self.room(view)
        role = raw[-1].get("role")
        if role == "tool":
            return self._again(view, kept, user_id, room, recaller)
        if role != "user" or view.messages[-1].get("role") != "user" or room <= 0:
            return 0, 0
        at = len(raw) - 1
        text = self.markers.user_text(raw[at])
        covered, substituted = hidden(view)
        found = recaller.block(
            self.session_id,
            user_id,
            text,
            visible_from=covered.stop,
            shown=substituted,
            max_chars=room,
            known_text=summary,
        )
        self.block, self.at = found.text, at
        self._turn = _TurnBlock(at, text, user_id, recaller.searched_epoch(), found)
        return found.excerpts, len(found.text)

    def _again(
        self, view: View, kept: _TurnBlock, user_id: str | None, room: int, recaller: Recaller
    ) -> tuple[int, int]:
        """The turn's block shown again in its tool loop, cut to ``room``."""
        at = self._turn_start(view)
        if (
            at < 0
            or kept[:3] != (at, self.markers.user_text(self.raw.messages[at]), user_id)
            or kept.epoch is None
            or kept.epoch != recaller.epoch()  # something forgotten or dropped since
        ):
            return 0, 0
        shown = kept.found.within(room, self.settings.language)
        self._turn = kept._replace(found=shown)
        self.block, self.at = shown.text, at
        return shown.excerpts, len(shown.text)

    def _turn_start(self, view: View) -> int:
        """The raw index of the current turn's user message (the last user message) when the
        view shows it as written, else -1."""
        raw = self.raw.messages
        low = view.head + view.offset  # the first raw index the tail shows
        for index in range(len(raw) - 1, low - 1, -1):
            if raw[index].get("role") == "user":
                return index
        return -1
