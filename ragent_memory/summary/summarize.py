"""The summarizer contract (docs/design.md §6; Ragent ``AgentConversationSummarizer``) and the model
summarizer, folding long material in chunks through ``llm.LLMClient``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import attrs

from ragent_memory.core.chars import Message
from ragent_memory.core.logs import EventCallback, get_logger
from ragent_memory.core.names import WrittenBy
from ragent_memory.errors import LLMError
from ragent_memory.summary.fence import neutralise, neutralise_tags, new_nonce
from ragent_memory.summary.prompt import EMPTY, build_prompt, lost_note
from ragent_memory.summary.transcript import DEFAULT_CLIP, Transcript
from ragent_memory.summary.validate import validate_summary

if TYPE_CHECKING:
    from ragent_memory.llm.client import LLMClient, Phase

log = get_logger(__name__)


@attrs.frozen
class SummaryRequest:
    material: tuple[Message, ...]
    previous: str  # the previous generation's body ("" for the first)
    language: str
    max_chars: int  # room for the body (the verbatim quotes are added after)
    lost: tuple[str, ...] = ()  # identifiers an earlier attempt lost (the retention retry)
    # The new material's identifiers a reply that repeated the previous summary left out (the
    # repeat's one retry names them)
    new: tuple[str, ...] = ()
    # The most chars one pass may send, every call together: instructions, running summary
    # and transcript; the engine passes B (docs/design.md §5). None: only docs/design.md §1's clip.
    input_chars: int | None = None


@attrs.frozen
class SummaryOutcome:
    body: str
    model: str
    attempts: int
    # Chars of rendered transcript sent by the pass that wrote ``body``, all chunks (the
    # audit's ``material_chars``); None: not known, the audit counts the raw material.
    material_chars: int | None = None
    # Who wrote ``body``: "model", "offline" (the offline summarizer as configured) or
    # "offline_fallback" (it stood in for a model that failed); "" when not said.
    written_by: WrittenBy = ""


class Summarizer(Protocol):
    name: str

    def summarize(self, request: SummaryRequest) -> SummaryOutcome: ...

    def close(self) -> None: ...


MIN_CHUNK_CHARS = 2_000
# max_tokens of a summary call: one token per target char, at least this many. English runs
# ~4 chars a token, Chinese ~1.5: room to finish a reply longer than the target, which
# validation then fits inside its sections (a reply cut short keeps only complete sections).
MIN_MAX_TOKENS = 512
# A model that echoes a fence tag after its summary stops there instead of going on.
STOP = ("</transcript", "<transcript", "</previous_summary", "<previous_summary")


class ModelSummarizer:
    """Summaries from an OpenAI-compatible model, with the offline summarizer as last resort:
    one pass stays within ``request.input_chars``, each call within ``max_input_chars``.
    ``retention_retry``: the engine may ask again, naming the identifiers a reply lost."""

    def __init__(
        self,
        client: LLMClient,
        *,
        model: str,
        max_input_chars: int,
        offline: Summarizer | None,
        on_event: EventCallback | None = None,
        retention_retry: bool = False,
    ) -> None:
        self.client = client
        self.max_input_chars = max_input_chars
        self.offline = offline
        self.on_event = on_event
        self.retention_retry = retention_retry
        self.name = model

    def cooling_down(self) -> float | None:
        """Seconds until an endpoint may be asked again when every one is cooling down after
        repeated failures and no offline fallback stands in, else None."""
        return None if self.offline is not None else self.client.cooling_down()

    def _prompt(
        self, transcript: str, previous: str, request: SummaryRequest
    ) -> tuple[list[dict[str, str]], str]:
        nonce = new_nonce()
        for _ in range(3):  # a nonce the text holds would be neutralised, lengthening it
            if nonce not in transcript.lower() and nonce not in previous.lower():
                break
            nonce = new_nonce()
        language = request.language
        messages = build_prompt(
            transcript, previous, nonce=nonce, language=language, max_chars=request.max_chars
        )
        messages[-1]["content"] += lost_note(request.lost, nonce, language)
        messages[-1]["content"] += lost_note(request.new, nonce, language, new=True)
        return messages, nonce

    def chunks(self, request: SummaryRequest) -> list[str]:
        """The transcript chunks one pass sends, within ``request.input_chars`` in all."""
        language = request.language
        empty, _ = self._prompt("", "", request)
        instructions = sum(len(m["content"]) for m in empty) - len(EMPTY[language])
        previous = request.previous
        first = instructions + (
            len(neutralise_tags(previous)) if previous.strip() else len(EMPTY[language])
        )
        # Later calls carry the running summary: a validated reply, at most max_chars.
        later = instructions + max(request.max_chars, len(EMPTY[language]))
        room = max(self.max_input_chars - max(first, later), MIN_CHUNK_CHARS)
        transcript = Transcript(request.material)
        input_chars = request.input_chars
        if input_chars is None:
            return transcript.chunks(DEFAULT_CLIP, room)

        def within(count: int) -> list[str]:
            budget = input_chars - first - (count - 1) * later
            return transcript.chunks(transcript.fit(max(budget, 0)), room)

        count = 1
        for _ in range(4):
            chunks = within(count)
            if len(chunks) <= count:
                return chunks
            count = len(chunks)
        # Still more chunks than budgeted: assume the most there can be (one per message).
        return within(len(request.material) + 1)

    def _call(
        self, transcript: str, previous: str, request: SummaryRequest
    ) -> tuple[str, str, int, int]:
        """One call: (body, model, attempts, transcript chars sent)."""
        messages, nonce = self._prompt(transcript, previous, request)

        def check(text: str, finish_reason: str = "stop") -> str:
            body = validate_summary(
                text, max_chars=request.max_chars, nonce=nonce, finish_reason=finish_reason
            )
            if len(body) < len(text.strip()):
                log.info(
                    "summary.fitted",
                    finish_reason=finish_reason,
                    reply_chars=len(text),
                    chars=len(body),
                    max_chars=request.max_chars,
                )
            return body

        completion = self.client.complete(
            messages,
            temperature=0.3,
            max_tokens=max(MIN_MAX_TOKENS, request.max_chars),
            validate=check,
            partial=lambda text: check(text, "length"),
            stop=STOP,
            purpose="summary",
        )
        sent = len(neutralise(transcript, nonce))
        return completion.text, completion.model, completion.attempts, sent

    def summarize(self, request: SummaryRequest) -> SummaryOutcome:
        body, attempts, model, sent = request.previous, 0, self.name, 0
        try:
            for chunk in self.chunks(request):
                body, model, used, chars = self._call(chunk, body, request)
                attempts += used
                sent += chars
        except LLMError as err:
            attempts += err.attempts
            if self.offline is None:
                raise
            log.warning("summarizer.offline_fallback", error=str(err))
            if self.on_event is not None:
                phase: Phase = "offline"
                event: dict[str, Any] = {"attempt": attempts + 1, "phase": phase, "error": None}
                event |= {"endpoint": None, "model": self.offline.name, "purpose": "summary"}
                self.on_event("summary_attempt", event)
            outcome = self.offline.summarize(request)
            return attrs.evolve(
                outcome, attempts=attempts + outcome.attempts, written_by="offline_fallback"
            )
        return SummaryOutcome(body, model, attempts, material_chars=sent, written_by="model")

    def close(self) -> None:
        self.client.close()
