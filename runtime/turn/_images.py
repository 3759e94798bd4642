"""Images as a turn extension (:class:`TurnImages`): routing, pixels, transcripts and ``image_read``.

The reply model's capability (:func:`runtime.llm.sees_images`) routes the whole request.

**Vision path.** The newest user turn's images expand into OpenAI ``image_url`` parts
(``data:`` URLs, re-encoded to ``COMPANION_IMAGE_BYTES`` by :func:`runtime.llm.fit_image`);
the message content becomes a list of parts, its text first. Images the assistant generated
(files carried by assistant turns since the previous user turn) cannot ride in an assistant
turn (an OpenAI-compatible API rule), so they are prepended to the next user turn with the
note ``prompts/image_relay_note.txt``. Older images fold into reference lines (with their
cached transcript, when one exists). No transcription call is made on this path, and
``image_read`` is not offered. The pixels' tokens (by the model family's rule,
:func:`runtime.llm.image_tokens`) are reserved out of ``recent``'s room before assembly,
so they count against the budgets like any other part.

**Text-only path.** Before the request, :meth:`TurnImages.before_reply` transcribes the newest
user turn's images that have no transcript yet, in one batched call
(:class:`runtime.llm.Transcriber`), and caches each in ``image_transcripts`` (the file id
stays the anchor; the transcript is a cache). Assembly renders each transcript under its turn
behind the marker of :mod:`runtime.context`. A turn whose text already holds a transcript
(any wording in ``TRANSCRIPT_MARKERS``) counts as transcribed: no call, and a doubled transcript
keeps the first. Older images that never got a transcript fold into references that the model
can ask about with the ``image_read`` tool (which transcribes on demand and caches).

Switching models: a vision model expands the newest turn's pixels again even if a text model
handled that turn; a text model reuses the cached transcript.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import structlog

from errors import FileParseError
from memory.files import FileStore, StoredFile
from memory.store import Store
from memory.tables import Turn, TurnState
from prompts import render
from runtime.accounting import TokenCounter
from runtime.config import VisionSettings
from runtime.context import (
    AssembledContext,
    AttachedFile,
    TurnBlocks,
    dedupe,
    render_transcript,
    safe_name,
    split_transcripts,
)
from runtime.llm import EncodedImage, ImageInput, Tools, Transcriber, fit_image, image_tokens, sees_images
from runtime.messages import ImagePart, Message, Part, TextPart
from runtime.turn._attachments import attached
from runtime.turn._extensions import Gathered

log = structlog.get_logger("companion.images")

TOOL_NAME = "image_read"
FOLDED_TRANSCRIPT_CHARS = 600
"""Characters of a cached transcript shown under an older turn's image reference."""
ENCODED_CACHE = 32
"""Re-encoded images kept in memory (an overflow retry assembles the same turn again)."""


@dataclass(frozen=True, kw_only=True)
class ImagePlan:
    """What assembly needs of the session's images."""

    files: Gathered
    """The attachments with the image blocks merged into ``blocks`` and turns deduped."""
    pixels: list[tuple[str, AttachedFile]] = field(default_factory=list)
    """Vision path: ``("generated" | "user", file)`` to expand into the newest user message, in order."""
    pixel_tokens: int = 0
    """Tokens those pixels cost (the model family's rule)."""
    tool_tokens: int = 0
    """Tokens of the ``image_read`` schema when it rides with the request (text path)."""
    newest: int | None = None
    """Seq of the newest user turn (the one the pixels join)."""


def image_read_spec() -> dict[str, Any]:
    """The OpenAI-format schema of ``image_read(file_id)``; its description is ``prompts/tool_image_read.txt``."""
    return {
        "type": "function",
        "function": {
            "name": TOOL_NAME,
            "description": render("tool_image_read"),
            "parameters": {
                "type": "object",
                "properties": {
                    "file_id": {"type": "string", "description": "The image's file id, e.g. file_0123456789abcdef0123."}
                },
                "required": ["file_id"],
                "additionalProperties": False,
            },
        },
    }


def _clip(text: str, chars: int) -> str:
    return text if len(text) <= chars else text[: chars - 1].rstrip() + "\u2026"


PIXEL_SHARE = 0.75
"""Share of the ``recent`` budget the newest turn's image pixels may take (our choice): the rest
keeps room for the message's own text and the turns before it. Images beyond it are named, not sent."""


class TurnImages:
    """Images in turns for one engine (module docstring)."""

    def __init__(
        self,
        *,
        settings: VisionSettings,
        store: Store,
        files: FileStore | None,
        counter: TokenCounter,
        model: str,
        transcriber: Transcriber | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.files = files
        self.model = model
        self.vision = sees_images(model, settings.models)
        """True: pixels go to the reply model; False: transcripts do."""
        self.transcripts = store.transcripts
        self.transcriber = transcriber or Transcriber(settings)
        self.spec = image_read_spec()
        self.spec_tokens = counter.count_text(json.dumps(self.spec, ensure_ascii=False))
        self._encoded: OrderedDict[str, EncodedImage] = OrderedDict()
        """file id -> its encoded pixels, newest use last, at most ``ENCODED_CACHE``; shared by every
        turn of the engine, so read, moved and evicted only under ``_encoded_lock``."""
        self._encoded_lock = threading.Lock()
        self._unreadable: dict[str, str] = {}
        """file id -> the placeholder of a transcription that failed in this process (not cached:
        a later ``image_read`` may succeed)."""

    # -- the turn-extension protocol -----------------------------------------------------
    name = "images"

    def stored(self, attached: Sequence[StoredFile]) -> None:
        return None

    def prepare(self, *, session_id: str) -> None:
        self.before_reply(session_id=session_id)

    def gather(self, gathered: Gathered, *, user_id: str, session_id: str) -> Gathered:
        plan = self.plan(gathered)
        return replace(
            plan.files,
            reserved_tokens=plan.files.reserved_tokens + plan.pixel_tokens + plan.tool_tokens,
            plans={**plan.files.plans, self.name: plan},
        )

    def finish(self, context: AssembledContext, gathered: Gathered) -> AssembledContext:
        plan = gathered.plans.get(self.name)
        return self.expand(context, plan) if isinstance(plan, ImagePlan) else context

    def request_tokens(self, context: AssembledContext) -> int:
        return 0

    # -- text path: transcribe before the request ----------------------------------------
    def before_reply(self, *, session_id: str) -> int:
        """Text path: transcribe the newest user turn's images that have no transcript (cached or
        in the turn's text) in one batched chain, and cache them. Returns the images sent to the
        chain (0 on the vision path or when all are known)."""
        if self.vision or self.files is None:
            return 0
        turns = self.store.turns.of_session(session_id, state=TurnState.context)
        newest = next((t for t in reversed(turns) if t.role == "user"), None)
        if newest is None:
            return 0
        rows = self.store.turns.attachments(session_id, head_chars=0).get(newest.id or -1, [])
        images = [attached(r) for r in rows if _is_image(r.mime)]
        if not images:
            return 0
        in_text = split_transcripts(newest.content)[1]
        cached = self.transcripts.get_many(f.file_id for f in images)
        todo = [f for f in images if f.file_id not in in_text and f.file_id not in cached]
        if not todo:
            log.info("image.transcripts_reused", session_id=session_id, images=len(images))
            return 0
        self._transcribe(todo, session_id=session_id)
        return len(todo)

    def _transcribe(self, images: Sequence[AttachedFile], *, session_id: str) -> dict[str, str]:
        assert self.files is not None
        inputs = []
        for f in images:
            stored = self.files.lookup(f.file_id)
            inputs.append(ImageInput(file_id=f.file_id, name=f.name, data=self.files.read_bytes(stored)))
        out = {}
        for t in self.transcriber.transcribe(inputs, session_id=session_id):
            if t.ok:
                self.transcripts.put(t.file_id, text=t.text, method=t.method, model=t.model)
                self._unreadable.pop(t.file_id, None)
            else:
                self._unreadable[t.file_id] = t.text
            out[t.file_id] = t.text
        log.info(
            "image.transcribed",
            session_id=session_id,
            images=len(images),
            failed=sum(1 for f in images if f.file_id in self._unreadable),
        )
        return out

    # -- assembly -------------------------------------------------------------------------
    def plan(self, files: Gathered) -> ImagePlan:
        """The image blocks of every turn merged into ``files`` (a read; the vision path
        re-encodes the newest turn's images, kept in a small memory cache)."""
        if not files.images:
            return ImagePlan(files=files)
        turns = [t.model_copy(update={"content": dedupe(t.content)}) if t.role == "user" else t for t in files.turns]
        newest = turns[-1].seq if turns and turns[-1].role == "user" else None
        ids = [f.file_id for fs in files.images.values() for f in fs]
        cached = {k: v.text for k, v in self.transcripts.get_many(ids).items()}
        by_seq = {t.seq: t for t in turns}
        blocks = dict(files.blocks)
        pixels: list[tuple[str, AttachedFile]] = []
        limit = self.pixel_limit()
        used = 0

        def take(kind: str, images: Sequence[AttachedFile]) -> tuple[list, list, list]:
            """Vision path: ``images`` split into shown (their pixels go), undecodable, and over the
            pixel limit, in order; the shown ones join ``pixels``."""
            nonlocal used
            shown, bad, over = [], [], []
            for f in images:
                encoded = self._encode(f)
                if encoded is None:
                    bad.append(f)
                    continue
                cost = image_tokens(self.model, encoded.width, encoded.height)
                if used + cost > limit:
                    over.append(f)
                    continue
                used += cost
                shown.append(f)
                pixels.append((kind, f))
            return shown, bad, over

        if self.vision and newest is not None:
            take("generated", self._generated(turns, files.images))
        for seq, images in files.images.items():
            turn = by_seq.get(seq)
            if turn is None or turn.role != "user":
                continue
            in_text = split_transcripts(turn.content)[1]
            if seq == newest:
                if self.vision:
                    shown, bad, over = take("user", images)
                    first = self._first_vision(shown, bad, over, limit=limit)
                else:
                    first = self._first(images, in_text, cached)
                folded = compact = first
            else:
                folded = self._folded(images, in_text, cached, with_transcripts=True)
                compact = self._folded(images, in_text, cached, with_transcripts=False)
            blocks[seq] = _merge(blocks.get(seq), first if seq == newest else folded, folded, compact, images)
        pixel_tokens = used
        shows_references = not self.vision and any(
            seq != newest and seq in by_seq and by_seq[seq].role == "user" for seq in files.images
        )
        return ImagePlan(
            files=replace(files, turns=turns, blocks=blocks),
            pixels=pixels,
            pixel_tokens=pixel_tokens,
            tool_tokens=self.spec_tokens if shows_references or (not self.vision and newest in files.images) else 0,
            newest=newest,
        )

    def _generated(self, turns: Sequence[Turn], images: dict[int, list[AttachedFile]]) -> list[AttachedFile]:
        """Images of the assistant turns since the user turn before the newest one (the relay queue)."""
        out: list[AttachedFile] = []
        for turn in reversed(turns[:-1]):
            if turn.role == "user":
                break
            out = list(images.get(turn.seq, [])) + out
        return out

    def pixel_limit(self) -> int:
        """Most pixel tokens the newest turn's images (and relayed generated ones) may take:
        :data:`PIXEL_SHARE` of the ``recent`` budget, so the message they come with always fits."""
        return int(self.settings.recent_cap * PIXEL_SHARE)

    @staticmethod
    def _first_vision(
        shown: Sequence[AttachedFile], bad: Sequence[AttachedFile], over: Sequence[AttachedFile], *, limit: int
    ) -> str:
        """The newest turn's image lines on the vision path: one numbered line per image whose
        pixels follow (numbers match the order of the image parts), then what is not shown and why."""
        lines = [
            render("image_attached", number=i + 1, file_name=safe_name(f.name), file_id=f.file_id)
            for i, f in enumerate(shown)
        ]
        lines += [render("image_undecodable", file_name=safe_name(f.name), file_id=f.file_id) for f in bad]
        lines += [
            render("image_over_budget", file_name=safe_name(f.name), file_id=f.file_id, limit=limit) for f in over
        ]
        return "\n".join(lines)

    def _first(self, images: Sequence[AttachedFile], in_text: dict[str, str], cached: dict[str, str]) -> str:
        parts = [render("images_header")]
        for f in images:
            if f.file_id in in_text:  # the turn's own text carries it
                continue
            if f.file_id in cached:
                parts.append(render_transcript(f.file_id, cached[f.file_id]))
            elif f.file_id in self._unreadable:
                parts.append(self._unreadable[f.file_id])
            else:  # not transcribed (e.g. a given reply): a reference the tool can resolve
                parts.append(render("image_reference", file_id=f.file_id, file_name=safe_name(f.name)))
                parts.append(render("image_reference_hint", file_id=f.file_id))
        return "\n".join(parts) if len(parts) > 1 else ""

    def _folded(
        self, images: Sequence[AttachedFile], in_text: dict[str, str], cached: dict[str, str], *, with_transcripts: bool
    ) -> str:
        parts = [render("images_folded_header")]
        for f in images:
            if f.file_id in in_text:
                continue
            parts.append(render("image_reference", file_id=f.file_id, file_name=safe_name(f.name)))
            if f.file_id in cached:
                if with_transcripts:
                    parts.append(_clip(cached[f.file_id], FOLDED_TRANSCRIPT_CHARS))
            elif not self.vision:
                parts.append(render("image_reference_hint", file_id=f.file_id))
        return "\n".join(parts) if len(parts) > 1 else ""

    def _encode(self, f: AttachedFile) -> EncodedImage | None:
        with self._encoded_lock:
            hit = self._encoded.get(f.file_id)
            if hit is not None:
                self._encoded.move_to_end(f.file_id)
                return hit
        if self.files is None:
            return None
        try:
            data = self.files.read_bytes(self.files.lookup(f.file_id))
            encoded = fit_image(data, budget=self.settings.image_bytes, name=f.name)
        except FileParseError:
            log.warning("image.undecodable", file_id=f.file_id)
            return None
        with (
            self._encoded_lock
        ):  # encoded outside the lock: two threads may both encode one image, never corrupt the cache
            self._encoded[f.file_id] = encoded
            while len(self._encoded) > ENCODED_CACHE:
                self._encoded.popitem(last=False)
        return encoded

    def expand(self, context: AssembledContext, plan: ImagePlan) -> AssembledContext:
        """Vision path: the newest user message as content parts (generated images and their note
        first, then its text, then its images). ``total_tokens`` already holds the pixels (reserved as
        overhead); they move from ``overhead_tokens`` to ``recent``."""
        if not plan.pixels or plan.newest is None or plan.newest not in context.recent_seqs:
            return context
        end = len(context.messages) - context.post_history_messages
        index = next(
            (
                i
                for i in range(end - 1, -1, -1)
                if context.messages[i]["role"] == "user" and i not in context.lore_messages
            ),
            None,
        )
        if index is None:
            return context
        message = context.messages[index]
        parts: list[Part] = []
        generated = [f for kind, f in plan.pixels if kind == "generated"]
        if generated:
            lines = [render("image_relay_note")] + [
                render("image_generated", number=i + 1, file_name=safe_name(f.name), file_id=f.file_id)
                for i, f in enumerate(generated)
            ]
            parts.append(TextPart(text="\n".join(lines)))
            parts += self._parts(generated)
        parts.append(TextPart(text=message["content"]))
        parts += self._parts([f for kind, f in plan.pixels if kind == "user"])
        messages = list(context.messages)
        messages[index] = Message(role="user", content=tuple(parts))
        recent = context.sources["recent"]
        sources = {**context.sources, "recent": replace(recent, tokens=recent.tokens + plan.pixel_tokens)}
        log.info(
            "image.expanded",
            session_id=context.session_id,
            images=len(plan.pixels),
            generated=len(generated),
            pixel_tokens=plan.pixel_tokens,
        )
        return replace(
            context,
            messages=messages,
            sources=sources,
            overhead_tokens=max(context.overhead_tokens - plan.pixel_tokens, 0),
        )

    def _parts(self, images: Sequence[AttachedFile]) -> list[Part]:
        out: list[Part] = []
        for f in images:
            encoded = self._encode(f)
            if encoded is not None:
                out.append(ImagePart(url=encoded.data_url(), detail="high"))
        return out

    # -- the image_read tool (text path) ----------------------------------------------------
    def tools(
        self, tools: Tools | None, context: AssembledContext, *, user_id: str, session_id: str, window: int = 0
    ) -> Tools | None:
        """``tools`` with ``image_read`` added on the text path while the context shows an image, and
        without ``file_read`` when the only files shown are images (it cannot read pixels)."""
        if self.files is None or not context.attached_files:
            return tools
        files = self.files
        shown = files.get_many(context.attached_files, user_id=user_id, with_extract=False)
        if not any(_is_image(f.mime) for f in shown.values()):
            return tools
        if tools is not None and all(_is_image(f.mime) for f in shown.values()):
            specs = [spec for spec in tools.specs if spec.get("function", {}).get("name") != "file_read"]
            tools = replace(tools, specs=specs) if specs else None
        if self.vision or self.settings.tool_rounds < 1:
            return tools

        def read(file_id: Any) -> str:
            if not isinstance(file_id, str):
                return "image_read needs a file_id string, e.g. file_0123456789abcdef0123."
            stored = files.get_many([file_id], user_id=user_id, session_id=session_id, with_extract=False)[file_id]
            if not _is_image(stored.mime):
                return f"{file_id} is not an image ({stored.mime}); use file_read for documents."
            cached = self.transcripts.get_many([file_id])
            if file_id in cached:
                return render_transcript(file_id, cached[file_id].text)
            got = self._transcribe(
                [
                    AttachedFile(
                        file_id=file_id,
                        name=stored.name,
                        mime=stored.mime,
                        size_bytes=stored.size_bytes,
                        durability=stored.durability,
                        parse_state=stored.parse_state,
                    )
                ],
                session_id=session_id,
            )
            return render_transcript(file_id, got[file_id])

        def run(name: str, arguments: dict[str, Any]) -> str:
            if name == TOOL_NAME:
                return read(arguments.get("file_id"))
            assert tools is not None
            return tools.run(name, arguments)

        if tools is None:
            return Tools(specs=[self.spec], run=run, max_rounds=self.settings.tool_rounds)
        return replace(tools, specs=[*tools.specs, self.spec], run=run)


def _is_image(mime: str) -> bool:
    from runtime.context import is_image_mime

    return is_image_mime(mime)


def _merge(doc: TurnBlocks | None, first: str, folded: str, compact: str, images: Sequence[AttachedFile]) -> TurnBlocks:
    """One turn's document blocks and image blocks as one :class:`TurnBlocks`."""

    def join(a: str, b: str) -> str:
        return "\n\n".join(x for x in (a, b) if x)

    ids = tuple(f.file_id for f in images)
    if doc is None:
        return TurnBlocks(first=first, folded=folded, compact=compact, file_ids=ids)
    return TurnBlocks(
        first=join(doc.first, first),
        folded=join(doc.folded, folded),
        compact=join(doc.compact, compact),
        file_ids=doc.file_ids + ids,
    )
