"""What a message says about recall: whom it names, and whether it says enough alone.

Pure text rules the turn applies before it recalls: :func:`named_speaker` (the speaker a
message is about, for the speaker ranking), :func:`without_names` (the text a user's message
is embedded from), and :func:`enrich_query` / :func:`enrichment` (a short follow-up is recalled
with the turns before it). How each rule was measured: ``docs/decisions/recall.md``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

_UNSPACED = re.compile(r"[\u3040-\u30ff\u3400-\u9fff\uac00-\ud7af\uf900-\ufaff]")
"""Kana, CJK ideographs and Hangul: a name with one of these is found wherever it appears, as
these scripts run words together or attach particles to them ("민수는", "さくらは")."""
_WORDLIKE = re.compile(r"\w")
"""A name must hold a letter or digit to count: one of only spaces or marks ("!!") is ignored."""
_GREETING = r"(?:(?:hey|hi|hello|dear|oh|ok|okay|well|so|yo|thanks|thank you)[\s,，]+|(?:嗨|哈喽|你好|亲爱的)[\s,，]*)?"
_ADDRESS_BEFORE = re.compile(r"^\s*" + _GREETING + r"$", re.I)
_ADDRESS_AFTER = re.compile(r"^\s*(?:[,，!！:：]|$)")
_ADDRESS_END = re.compile(r"[,，]\s*$")
_TRAILING = re.compile(r"^[\s.!?。！？…~]*$")


@dataclass(frozen=True)
class _Mention:
    start: int
    end: int
    name: str
    address: bool
    """Said to the person ("Melanie, what did I paint?", "Hey Mel!", "..., Mel?"), not about them."""


def _mentions(message: str, names: Iterable[str]) -> list[_Mention]:
    """Where ``names`` occur in ``message``: longest names first, a shorter one never inside a
    longer one's match ("Mary Jane" is not also "Jane"); spaces inside a name match any run of
    spaces; a name in a spaced script as a whole word, case-insensitive, with a possessive "'s"."""
    found: list[_Mention] = []
    wanted = {" ".join(n.split()): n for n in names if _WORDLIKE.search(n)}
    for name in sorted(wanted, key=len, reverse=True):
        body = r"\s+".join(re.escape(part) for part in name.split())
        pattern = body if _UNSPACED.search(name) else r"(?<!\w)" + body + r"(?:['’]s)?(?!\w)"
        for m in re.finditer(pattern, message, re.I):
            if any(m.start() < f.end and f.start < m.end() for f in found):
                continue
            before, after = message[: m.start()], message[m.end() :]
            address = bool(
                (_ADDRESS_BEFORE.match(before) and _ADDRESS_AFTER.match(after))
                or (_ADDRESS_END.search(before) and _TRAILING.match(after))
            )
            found.append(_Mention(m.start(), m.end(), wanted[name], address))
    return found


def named_speaker(message: str, names: Mapping[str, str]) -> str | None:
    """The label of the one speaker ``message`` is about, for :class:`memory.recall.RecallQuery`' ``speaker``.

    ``names`` maps each name a speaker goes by (the user's display name; the character's
    name and nickname) to the label of that speaker's archived lines (``User``, the
    character's name). A name counts as a whole word, case-insensitive ("melanie's" names
    Melanie, "Melanies" does not); a name in kana, CJK or Hangul, wherever it appears; a name
    without a letter or digit, never; of two overlapping names, the longer. A name the message
    is said to rather than about does not count: at the start, alone or after a greeting and
    before a comma or "!" ("Melanie, what did I paint?", "Hey Mel! ..."), or at the end after a
    comma ("..., Mel?"). ``None`` when the message is about no speaker, or about two.

    Known limits: a name that is also a common word ("Will", "May") is found in that word, and
    a short CJK name inside a longer word (a persona "小雨" in "下小雨了")."""
    labels = {names[m.name] for m in _mentions(message, names) if not m.address}
    return labels.pop() if len(labels) == 1 else None


def without_names(message: str, names: Iterable[str]) -> str:
    """``message`` without the speakers' ``names`` (wherever :func:`named_speaker` finds them,
    said to or about the person), spaces collapsed; ``message`` itself when it holds no name, or
    nothing but names.

    The text a user's message is embedded from (the runtime, the replay and the re-embed). Its
    vector is the recall query while the message is the newest, and a part of its archive key;
    archive keys are composed from turns' texts, which carry no speaker labels, so a name pulls
    towards lines that address that person by name rather than towards what is said, and who
    is asked about is :func:`named_speaker`'s part. On the LoCoMo tuning split (evidence recall %
    at 250 / 500 / 1,000 / 2,000 tokens, with the speaker ranking): 59.2 / 70.0 / 79.5 / 84.2 with
    the names, 62.3 / 71.5 / 80.4 / 86.3 without (``scripts/eval_recall.py --components``)."""
    mentions = sorted(_mentions(message, names), key=lambda m: m.start)
    if not mentions:
        return message
    parts, at = [], 0
    for m in mentions:
        parts.append(message[at : m.start])
        at = m.end
    parts.append(message[at:])
    text = " ".join(" ".join(parts).split())
    return text if _WORDLIKE.search(text) else message


ENRICH_WORDS = 4
"""A message of at most this many words (a CJK character counts as two thirds of a word,
Chinese words averaging about 1.5 characters) says too little to recall by alone;
:func:`enrich_query` adds the turns before it. Up to twice as many words, it does so when
the message opens with a connective or ends on a pronoun."""
ENRICH_TURNS = 2
"""How many turns before the message :func:`enrich_query` adds."""
_ANAPHORA = re.compile(
    r"^\s*(?:and|but|so|then|what about|how about|and what about)\b|\b(?:that|this|it|those|these|her|him|them|she|he|they|there)\b[\s?!.]*$"
    r"|^\s*(?:那|然后|后来|还有|那么|所以)|(?:呢|那个|这个|那件事|这件事|他|她|它|他们|她们)[\s?？!！。]*$",
    re.I,
)
_WORD = re.compile(r"[\u3400-\u9fff]|[^\W\u3400-\u9fff]+")


def enrich_query(message: str, previous: Sequence[str]) -> str:
    """The text to recall by for ``message``: the message itself, or, for a follow-up that
    says little alone ("那后来呢?", "and her?", "what happened with that?"), the last
    :data:`ENRICH_TURNS` turns of ``previous`` (oldest first) and then the message, one per line.

    A follow-up is a message of at most :data:`ENRICH_WORDS` words (a CJK character is
    two thirds of a word), or of at most twice that which opens with a connective ("and",
    "then", "那", "后来") or ends on a pronoun or "呢". With no previous turns the message
    is returned unchanged. Which turns join it: :func:`enrichment`.
    """
    return "\n".join([*(previous[i] for i in enrichment(message, previous)), message])


def enrichment(message: str, previous: Sequence[str]) -> list[int]:
    """The positions in ``previous`` of the turns :func:`enrich_query` puts before ``message``,
    oldest first: the last :data:`ENRICH_TURNS` that are not blank when ``message`` is a
    follow-up, else ``[]``. The engine composes the enriched query's vector from these turns'
    vectors and the message's (:func:`memory.archive.compose`) instead of embedding the text."""
    words = _WORD.findall(message)
    size = sum(2 / 3 if len(w) == 1 and "\u3400" <= w <= "\u9fff" else 1 for w in words)
    short = size <= ENRICH_WORDS or (size <= 2 * ENRICH_WORDS and _ANAPHORA.search(message) is not None)
    if not previous or not short:
        return []
    start = max(len(previous) - ENRICH_TURNS, 0)
    return [i for i in range(start, len(previous)) if previous[i].strip()]
