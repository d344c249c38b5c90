"""A session's sticky substitutions (docs/design.md §4, §4b, §8): placeholders and previews recorded
in the store with their offloaded originals, shown in every later view of the same message."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

from ragent_memory.core.chars import Message, chars, text_of
from ragent_memory.core.logs import get_logger
from ragent_memory.engine.raw import RawCache
from ragent_memory.engine.view import HistoryIndex, View, substitution_index
from ragent_memory.errors import RagentMemoryError
from ragent_memory.recall.excerpts import place
from ragent_memory.store import OffloadStore, Substitution, substitution_key

log = get_logger(__name__)

# (view index, substitution, texts to offload) of a substitution not recorded yet
NewSubstitution = tuple[int, Substitution, Sequence[str]]


# What a consumer that joins a message's text parts puts between them (LangChain's OpenAI
# conversion, many providers): a recall block, its own part before the user's words, costs it.
PART_SEPARATOR = "\n"


def shown_chars(sub: Substitution) -> int:
    """What ``sub`` takes of B where it is shown: its chars, and for a recall block (shown
    on the caller's message, whose chars come on top) the separator a consumer joining the
    message's parts puts after it."""
    return chars(sub.message) + (len(PART_SEPARATOR) if sub.kind == "recall" else 0)


def block_text(sub: Substitution) -> str:
    """The recall block a ``recall`` substitution records (its message holds only that)."""
    return str(sub.message["content"][0]["text"])


def _said(message: Message) -> str:
    """What identifies the message a recall block rides on: the digest of its text alone, so
    a client re-sending the same words in another shape (a string for one text part, its
    cache marks moved) keeps its block."""
    return "r" + hashlib.sha256(text_of(message).encode("utf-8", "surrogatepass")).hexdigest()[:31]


class Sticky:
    """The substitutions of one session by key (position after the prefix : digest)."""

    def __init__(
        self,
        session_id: str,
        subs: dict[str, Substitution],
        *,
        store: OffloadStore,
        raw: RawCache,
        ttl_days: float,
    ) -> None:
        self.session_id = session_id
        self.subs = subs
        # positions that hold one: only those need a digest to look one up
        self.positions = {int(key.partition(":")[0]) for key in subs}
        self.store = store
        self.raw = raw
        self.ttl_days = ttl_days
        self.dropped = 0  # recall blocks taken off their messages since the count was reset

    def ref_for(self, text: str) -> str:
        return self.store.ref_for(self.session_id, text)

    def key(self, view: View, index: int) -> str:
        """The key of the caller's message shown at view ``index``."""
        raw_index = view.history_index(index)
        return substitution_key(view.substitution_index(raw_index), self.raw.digest_at(raw_index))

    def at(self, raw_index: int, prefix_len: int) -> Substitution | None:
        """The substitution recorded for history ``raw_index`` after ``prefix_len`` system
        messages (None: none)."""
        position = substitution_index(raw_index, prefix_len)
        if position not in self.positions:
            return None
        found = self.subs.get(substitution_key(position, self.raw.digest_at(raw_index)))
        if found is None:  # a recall block is keyed by the message's words
            found = self.subs.get(self._block_key(raw_index, prefix_len))
        return found

    def _block_key(self, raw_index: int, prefix_len: int) -> str:
        position = substitution_index(raw_index, prefix_len)
        return substitution_key(position, _said(self.raw.messages[raw_index]))

    def show_recorded(self, view: View, begin: int) -> None:
        """Show the recorded substitutions of raw messages ``[begin, end)`` in ``view``."""
        prefix_len = view.prefix_len
        for raw_index in range(begin, len(self.raw.messages)):
            sub = self.at(raw_index, prefix_len)
            if sub is None:
                continue
            if sub.kind == "recall":  # the block on the message as the caller sends it now
                shown = place(self.raw.messages[raw_index], block_text(sub))
                size = self.raw.sizes[raw_index] + shown_chars(sub)
                view.show(view.view_index(raw_index), shown, sub.kind, size)
            else:
                view.show(view.view_index(raw_index), sub.message, sub.kind, shown_chars(sub))

    def record(
        self,
        view: View,
        new: Sequence[NewSubstitution],
        on_left: Callable[[list[HistoryIndex]], None],
    ) -> bool:
        """Persist ``new`` (and offload their originals), then show them; ``on_left`` gets
        their raw indexes. If the store fails the view stays as it was (a placeholder must
        never point nowhere) and False is returned."""
        if not new:
            return True
        try:
            self.store.save_substitutions(
                self.session_id, [(sub, texts) for _, sub, texts in new], ttl_days=self.ttl_days
            )
        except RagentMemoryError as err:
            log.error("substitutions.write_failed", session_id=self.session_id, error=repr(err))
            return False
        for index, sub, _ in new:
            self.subs[sub.key] = sub
            self.positions.add(view.substitution_index(view.history_index(index)))
            view.show(index, sub.message, sub.kind, chars(sub.message))
            if sub.kind == "truncate":
                log.info(
                    "reduce.truncated",
                    session_id=self.session_id,
                    original_chars=chars(view.originals[index]),
                    shown_chars=view.sizes[index],
                )
        on_left(sorted(view.history_indexes(index for index, _, _ in new)))
        return True

    def keep_recall_block(self, view: View, index: int, block: str, found_under: str) -> bool:
        """Show ``block`` on the caller's message at view ``index`` from now on, in this view
        and every later one, recorded with what it was ``found_under`` (``stamp``). Nothing
        leaves the view: the caller's words are all still shown. False when the store
        refused it (the view is left as it was)."""
        raw_index = view.history_index(index)
        message = {"role": "user", "content": [{"type": "text", "text": block}]}
        key = self._block_key(raw_index, view.prefix_len)
        sub = Substitution(key, "recall", found_under, message)
        try:
            self.store.save_substitutions(self.session_id, [(sub, ())], ttl_days=self.ttl_days)
        except RagentMemoryError as err:
            log.error("substitutions.write_failed", session_id=self.session_id, error=repr(err))
            return False
        self.subs[key] = sub
        self.positions.add(view.substitution_index(raw_index))
        shown = place(self.raw.messages[raw_index], block)
        view.show(index, shown, "recall", self.raw.sizes[raw_index] + shown_chars(sub))
        return True

    def drop_recall_blocks(self, view: View, indexes: Sequence[int]) -> None:
        """The recall blocks shown at view ``indexes`` are taken off their messages (shown as
        written again), in the store first: a block the store still held would come back."""
        keys = [self._block_key(i, view.prefix_len) for i in view.history_indexes(indexes)]
        if not keys:
            return
        try:
            self.store.delete_substitutions(self.session_id, keys)
        except RagentMemoryError as err:
            log.error("substitutions.write_failed", session_id=self.session_id, error=repr(err))
            return
        self.dropped += len(keys)
        for index, key in zip(indexes, keys, strict=True):
            self.subs.pop(key, None)
            view.unshow(index, self.raw.sizes[view.history_index(index)])
