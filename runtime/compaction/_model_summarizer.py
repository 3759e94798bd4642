"""The model summarizer: a model writes a structured summary in five parts (who the user is; the
relationship and shared events, dated; preferences and taboos; open threads and promises; the
user's own words as exact quotes) from ``prompts/summary_model_system.txt``; and the choice of
summarizer from the settings (:func:`summarizer_for`)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from errors import SummarizationError
from prompts import render
from runtime._offline import load_litellm
from runtime.accounting import TokenCounter
from runtime.compaction._summarizers import (
    ExtractiveSummarizer,
    RolledTurn,
    Summarizer,
    SummaryDraft,
    fit_to_cap,
    render_summary,
)
from runtime.llm import map_model_error
from runtime.messages import Message, to_openai
from runtime.summary_items import NOTE_SECTIONS, AssistantLine, NoteSection, SummaryItem, SummaryNote, UserQuote

if TYPE_CHECKING:
    from runtime.config import Settings


def map_summarizer_error(exc: BaseException, *, model: str, session_id: str | None) -> SummarizationError:
    """Turn an exception from litellm (or the network under it) into a :class:`SummarizationError`.

    The exception is classified by :func:`runtime.llm.map_model_error`, the same mapping the
    replier uses; the result is the returned error's ``__cause__`` (and ``exc`` is that one's),
    so raise it as it is, without ``from``. The message is the mapped error's: it names the
    model, the HTTP status when there is one, and the original class, never conversation text.
    """
    cause = map_model_error(exc, model=model, session_id=session_id)
    cause.__cause__ = exc
    error = SummarizationError(f"The summary failed: {cause}", session_id=session_id)
    error.__cause__ = cause
    return error


ModelSummaryJSON = dict[str, list[str | dict[str, str | int | None]]]
"""The model's five-part summary as JSON: each note section a list of texts (``relationship``: of
``{"date", "text"}``), ``quotes`` a list of ``{"seq", "text"}``."""


def previous_as_json(previous: Sequence[SummaryItem]) -> ModelSummaryJSON:
    """The current summary's items in the model's five-part JSON shape.

    Items of an extractive summary are converted: user lines become quotes, assistant
    lines dated relationship notes.
    """
    out: ModelSummaryJSON = {section: [] for section in NOTE_SECTIONS}
    out["quotes"] = []
    for item in previous:
        if isinstance(item, UserQuote):
            out["quotes"].append({"seq": item.seq, "text": item.text})
        elif isinstance(item, AssistantLine):
            out["relationship"].append({"date": item.date, "text": f"The companion said: {item.text}"})
        elif item.section == "relationship":
            out["relationship"].append({"date": item.date, "text": item.text})
        else:
            out[item.section].append(item.text)
    return out


def _turn_lines(turns: Sequence[RolledTurn], assistant_name: str) -> str:
    lines = []
    for t in turns:
        speaker = "User" if t.role == "user" else assistant_name
        text = t.text + (render("notice_turn_cut", shown=len(t.text), total=t.chars) if t.cut else "")
        lines.append(render("summary_model_turn", seq=t.seq, date=t.date, speaker=speaker, text=text))
    return "\n".join(lines)


def _json_object(raw: str) -> Mapping[str, object]:
    """The JSON object in a model reply (a fenced block or bare object)."""
    start, end = raw.find("{"), raw.rfind("}")
    if start < 0 or end < start:
        raise ValueError("the reply holds no JSON object")
    value: object = json.loads(raw[start : end + 1])
    if not isinstance(value, dict):
        raise ValueError("the reply's JSON is not an object")
    return value


def parse_model_summary(raw: str, *, turns: Sequence[RolledTurn], previous: Sequence[SummaryItem]) -> list[SummaryItem]:
    """The model's JSON reply as flat items, oldest quote first.

    Quote dates come from the turn (or the previous quote) with that seq.

    Raises:
        ValueError: the reply is not the five-part JSON object.
    """
    data = _json_object(raw)
    notes: list[SummaryItem] = []
    for section in NOTE_SECTIONS:
        entries = data.get(section, [])
        if not isinstance(entries, list):
            raise ValueError(f"{section!r} is not a list")
        for entry in entries:
            text, date = _note_entry(entry, section)
            if text.strip():
                notes.append(SummaryNote(section=section, date=str(date) if date else None, text=text.strip()))
    dates = {t.seq: t.date for t in turns}
    dates.update({i.seq: i.date for i in previous if i.seq is not None and i.date is not None})
    quotes = data.get("quotes", [])
    if not isinstance(quotes, list):
        raise ValueError("'quotes' is not a list")
    found: list[UserQuote] = []
    for entry in quotes:
        seq, quoted = _quote_entry(entry)
        found.append(UserQuote(section="quotes", seq=seq, date=dates.get(seq, "?"), text=quoted))
    return [*notes, *sorted(found, key=lambda i: i.seq)]


def _quote_entry(entry: object) -> tuple[int, str]:
    """A quote entry's seq and text."""
    if (
        isinstance(entry, dict)
        and isinstance(seq := entry.get("seq"), int)
        and isinstance(text := entry.get("text"), str)
    ):
        return seq, text
    raise ValueError("a quote is not {seq: int, text: str}")


def _note_entry(entry: object, section: NoteSection) -> tuple[str, object]:
    """A note entry's text and date (``None`` for a bare string)."""
    if isinstance(entry, str):
        return entry, None
    if isinstance(entry, dict) and isinstance(text := entry.get("text"), str):
        return text, entry.get("date")
    raise ValueError(f"an entry of {section!r} is neither text nor {{date, text}}")


class LiteLLMSummarizer:
    """A model summarizer: one ``litellm.completion`` call per compaction.

    The prompt is ``prompts/summary_model_system.txt`` plus
    ``prompts/summary_model_request.txt``; the model answers with the five-part JSON
    object, which is parsed into items, fitted to the cap (oldest quotes leave first)
    and rendered by :func:`render_summary`.

    Args:
        model: a litellm model string (``COMPANION_SUMMARY_MODEL``, default ``COMPANION_MODEL``).
        api_base: base URL of an OpenAI-compatible server, or ``None`` for the provider's.
        timeout: seconds to wait for the whole reply; a timeout is a failure.
        extra: more keyword arguments for ``litellm.completion`` (e.g. ``api_key``, ``mock_response``).
    """

    name = "model"

    def __init__(self, *, model: str, api_base: str | None = None, timeout: float = 60.0, **extra: Any) -> None:
        self.model = model
        self.api_base = api_base
        self.timeout = timeout
        self.extra = extra

    def messages(
        self,
        *,
        previous: Sequence[SummaryItem],
        turns: Sequence[RolledTurn],
        cap: int,
        assistant_name: str,
    ) -> list[Message]:
        """The request for one merge."""
        return [
            Message(role="system", content=render("summary_model_system", cap=cap, assistant_name=assistant_name)),
            Message(
                role="user",
                content=render(
                    "summary_model_request",
                    previous=json.dumps(previous_as_json(previous), ensure_ascii=False, indent=1),
                    turns=_turn_lines(turns, assistant_name),
                ),
            ),
        ]

    def summarize(
        self,
        *,
        previous: Sequence[SummaryItem],
        turns: Sequence[RolledTurn],
        cap: int,
        counter: TokenCounter,
        omitted_before: int = 0,
        session_id: str | None = None,
        assistant_name: str = "Companion",
    ) -> SummaryDraft:
        if not turns:
            raise SummarizationError("Nothing to summarize: no turns were given.", session_id=session_id)
        litellm = load_litellm()

        try:
            response = litellm.completion(
                model=self.model,
                messages=to_openai(
                    self.messages(previous=previous, turns=turns, cap=cap, assistant_name=assistant_name)
                ),
                api_base=self.api_base,
                timeout=self.timeout,
                num_retries=0,  # litellm's own retries
                max_retries=0,  # the OpenAI client's retries: the breaker and its time budget count every attempt
                **self.extra,
            )
            raw = response.choices[0].message.content or ""
        except (
            Exception
        ) as exc:  # every litellm/httpx/openai error (or a reply without a message) becomes one SummarizationError
            raise map_summarizer_error(exc, model=self.model, session_id=session_id)  # noqa: B904 (chained inside)
        try:
            items = parse_model_summary(raw, turns=turns, previous=previous)
        except ValueError as exc:  # json.JSONDecodeError is a ValueError
            raise SummarizationError(
                f"The summary model {self.model!r} did not answer with the five-part JSON summary: {exc}",
                session_id=session_id,
            ) from exc
        kept, dropped = fit_to_cap(items, omitted=omitted_before, cap=cap, counter=counter)
        content = render_summary(kept, omitted_before + len(dropped))
        return SummaryDraft(
            content=content,
            items=kept,
            tokens=counter.count_text(content),
            dropped=len(dropped),
            dropped_quote_seqs=dropped,
        )


def summarizer_for(settings: Settings) -> Summarizer:
    """The summarizer ``COMPANION_SUMMARIZER`` names: ``extractive`` (model-free) or ``model``
    (:class:`LiteLLMSummarizer` on ``COMPANION_SUMMARY_MODEL``, default ``COMPANION_MODEL``)."""
    if settings.summarizer == "model":
        return LiteLLMSummarizer(
            model=settings.summary_model or settings.model, api_base=settings.api_base, timeout=settings.summary_timeout
        )
    return ExtractiveSummarizer()
