"""Image request bodies: a page as a scanner gives it (PNG, seeded: the same bytes everywhere) and
the chat request that carries it, as an OCR client sends it."""

from __future__ import annotations

import base64
import io
import random

from PIL import Image, ImageDraw

from .procs import STUB_MODEL

WORDS = ["invoice", "total", "amount", "2026", "page", "section", "lorem", "ipsum", "reward",
         "model", "policy", "score", "batch", "replica", "seed", "fingerprint"]


def scan_page(width: int, height: int, noise: float, mode: str = "L", seed: int = 0) -> bytes:
    """A text page as a flatbed scanner gives it: dark words on paper grey, sensor noise."""
    rng = random.Random(seed)
    page = Image.new(mode, (width, height), 235 if mode == "L" else (235, 232, 225))
    draw = ImageDraw.Draw(page)
    y = 30
    while y < height - 30:
        x = 30
        while x < width - 90:
            word = rng.choice(WORDS)
            ink = rng.randint(0, 60)
            draw.text((x, y), word, fill=ink if mode == "L" else (ink, ink, ink + 10))
            x += 7 * len(word) + rng.randint(6, 14)
        y += rng.randint(14, 20)
    grain = Image.effect_noise((width, height), 64).convert(mode)
    scanned = Image.blend(page, grain, noise)
    out = io.BytesIO()
    scanned.save(out, "PNG")
    return out.getvalue()


def chat_body(raw: bytes) -> dict[str, object]:
    """A chat request transcribing one PNG, sent as a data URL."""
    url = "data:image/png;base64," + base64.b64encode(raw).decode()
    return {"model": STUB_MODEL, "max_tokens": 16, "seed": 1, "messages": [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                     {"type": "text", "text": "Transcribe the page."}]}]}
