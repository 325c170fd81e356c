"""Helpers for the scoring tests: images, a fake backend seam, custom scorers, a batch runner."""

from __future__ import annotations

import base64
import io
import zlib
from typing import Any

from PIL import Image, ImageDraw

from grm_service.fingerprint import Fingerprint, json_digest
from grm_service.gateway.request.checkpoint import Limits, check_body
from grm_service.gateway.request.images import ImageLimits
from grm_service.scoring.batch import score_batch
from grm_service.scoring.context import CHAT_PATH, Reply, ScorerContext
from grm_service.scoring.models import ScoreItem, ScoreRequest
from grm_service.scoring.registry import lookup


def png(text: str = "HELLO", size: tuple[int, int] = (96, 32)) -> bytes:
    img = Image.new("RGB", size, "white")
    ImageDraw.Draw(img).text((4, 8), text, fill="black")
    out = io.BytesIO()
    img.save(out, format="PNG")
    return out.getvalue()


def data_url(text: str = "HELLO", size: tuple[int, int] = (96, 32)) -> str:
    return "data:image/png;base64," + base64.b64encode(png(text, size)).decode()


def fingerprint(body: dict[str, Any], payload: dict[str, Any], replica: str = "r0") -> Fingerprint:
    return Fingerprint(fingerprint_id="grm-test", identity="verified", seed=42, model_hash="m",
                       env_digest="e", engine="fake", engine_version="0", device="cpu",
                       replica=replica, serialized=True, request_digest=json_digest(body),
                       response_digest=json_digest(payload))


LIMITS = Limits(ImageLimits(max_bytes=1 << 20, max_pixels=1 << 20))


CUSTOM = ("length=tests.support.scoring:length_score", "rule=tests.support.scoring:rule_score",
          "broken=tests.support.scoring:broken_score")


def request(scorer: str, items: list[dict[str, Any]], **kw: Any) -> ScoreRequest:
    return ScoreRequest.model_validate({"scorer": scorer, "items": items, **kw})


async def run(req: ScoreRequest, send: Any, concurrency: int = 8) -> Any:
    return await score_batch(req, lookup(req.scorer, CUSTOM), send, concurrency, "grm-test")


class FakeBackend:
    """A `Send` that answers chat with a canned text (or the body's last text part echoed).

    Like the gateway's own send, it passes every body through the checkpoint first; a body the
    checkpoint refuses is not recorded in `calls`.
    """

    def __init__(self, answer: str | None = None, probs: list[float] | None = None) -> None:
        self.answer, self.probs = answer, probs or [0.25]
        self.calls: list[tuple[str, dict[str, Any]]] = []

    async def __call__(self, path: str, body: dict[str, Any]) -> Reply:
        check_body(path, body, LIMITS)
        self.calls.append((path, body))
        if path == CHAT_PATH:
            text = self.answer if self.answer is not None else _last_text(body)
            payload: dict[str, Any] = {"choices": [{"index": 0,
                                                    "message": {"content": text}}]}
        else:
            payload = {"data": [{"index": 0, "probs": self.probs}]}
        return payload, fingerprint(body, payload)


def _last_text(body: dict[str, Any]) -> str:
    content = body["messages"][-1]["content"]
    return content if isinstance(content, str) else content[-1]["text"]


async def length_score(item: ScoreItem, ctx: ScorerContext) -> float:
    """A custom scorer for engine tests: asks the model, scores its answer's length (0..1)."""
    text = await ctx.chat([{"role": "user", "content": item.completion or item.prompt or "?"}],
                          temperature=0.7, top_p=0.8, max_tokens=12)
    return (len(text) % 11) / 10


def rule_score(item: ScoreItem, ctx: ScorerContext) -> float:
    """A sync, rule-only custom scorer."""
    return float((item.completion or "").strip() == (item.reference or "").strip())


def broken_score(item: ScoreItem, ctx: ScorerContext) -> float:
    raise ZeroDivisionError("boom")


def without_replica(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Results as compared across services: the serving replica's name may differ."""
    out = []
    for r in results:
        r = dict(r)
        if r.get("fingerprint"):
            r["fingerprint"] = {k: v for k, v in r["fingerprint"].items() if k != "replica"}
        out.append(r)
    return out




def group_shape_score(item: ScoreItem, ctx: ScorerContext) -> float:
    """A custom scorer that shows what reached the gateway: a number from the item's group
    fields and the length of its id (a trainer test recomputes it)."""
    return group_shape(item.group_id, item.group_size, len(item.id))


def group_shape(group_id: str | None, group_size: int | None, id_length: int) -> float:
    return zlib.crc32(f"{group_id}/{group_size}/{id_length}".encode()) / 2**32


async def trainer_score(item: ScoreItem, ctx: ScorerContext) -> float:
    """A custom scorer for the trainer tests on STUB replicas: one chat call through a replica
    (so every item carries a replica's fingerprint), then 1.0 when the completion is one of the
    references and a length-derived fraction otherwise. A prompt containing FAIL fails its item."""
    await ctx.chat([{"role": "user", "content": item.completion or "?"}], max_tokens=4)
    if "FAIL" in (item.prompt or ""):
        raise ValueError("the prompt asked this item to fail")
    answers = [item.reference, *item.extra.get("references", [])]
    if (item.completion or "").strip() in answers:
        return 1.0
    return (len(item.completion or "") % 7) / 10


async def clip_standin_score(item: ScoreItem, ctx: ScorerContext) -> float:
    """A STAND-IN for the `clip` scorer, for the trainer tests on STUB replicas: one request with
    the item's image and prompt through a replica (whose stub answer is derived from the request
    bytes), the score a fraction read from that answer, so it differs by image and by prompt."""
    content = [{"type": "image_url", "image_url": {"url": url}} for url in item.frames()]
    content.append({"type": "text", "text": item.prompt or ""})
    text = await ctx.chat([{"role": "user", "content": content}], max_tokens=4)
    return int(text.removeprefix("stub-")[:8], 16) / 2**32

