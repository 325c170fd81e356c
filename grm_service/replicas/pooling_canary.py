"""Pooling canary: a replica may co-batch `/classify`, `/pooling` and `/v1/embeddings` requests only
once it showed that doing so changes no bit.

Runs only where the profile of the engine the replica reports running declares pooling
batch-invariant (`Capabilities.pooling_invariant`: a GPU vLLM release measured so, with
`VLLM_BATCH_INVARIANT=1` in its environment); elsewhere (unverified replicas included) pooling
stays one request at a time and nothing is probed. The probe texts are classified one at
a time, then all at once among filler requests of other lengths; the outputs (`data`, compared as
canonical JSON, so every float bit counts) must agree with each other and with those of the first
admitted replica of the same identity. A replica that disagrees with that reference even alone
computes something else and is refused; one that only changes when co-batched keeps pooling
serialized.

The probes take the model's own shape: `/classify` for a classifier; for an embedding model (no
`/classify`: CLIP, SigLIP) texts on `/v1/embeddings`, and images too (chat-style messages, PNGs
of several sizes) where the model embeds them, so both towers are proven.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import httpx

from grm_service import probe_images
from grm_service.config import SerializeMode, Settings
from grm_service.fingerprint import response_digest
from grm_service.metrics import Metrics
from grm_service.replicas.identity import capabilities_of
from grm_service.replicas.pool import Replica

log = logging.getLogger(__name__)

_CLASSIFY = "/classify"
_EMBED = "/v1/embeddings"
# The replica serves no pooling model: a generative model answers these.
_NOT_POOLING = (400, 404, 405, 501)


# Common words, each one token in CLIP's and SigLIP's vocabularies. Every probe must fit the
# shortest context a pooling model has (SigLIP's 64 tokens, CLIP's 77): an engine refuses a longer
# one with a 400, and a replica whose probe is refused is never admitted.
_WORDS = ("a", "red", "cat", "sat", "on", "the", "blue", "mat", "by", "an", "old", "green",
          "door", "while", "two", "small", "dogs", "ran", "in", "the", "park", "under", "a",
          "warm", "sun", "and", "one", "bird", "sang")


def _texts(n: int, tag: str) -> list[str]:
    """Distinct texts of 3 to 17 words, so the co-batched run mixes shapes."""
    return [f"{tag} {i}: " + " ".join(_WORDS[(i + j) % len(_WORDS)]
                                      for j in range(3 + 2 * (i % 8)))
            for i in range(n)]


def _image(i: int) -> dict[str, Any]:
    url = probe_images.png_data_url(24 + 16 * i, 40 + 8 * i, i)
    return {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": url}}]}]}


class NotPooling(Exception):
    """The replica serves neither `/classify` nor `/v1/embeddings`."""


class PoolingCanary:
    """An admission check: `await check(replica, client)` -> problem text or None."""

    def __init__(self, settings: Settings, metrics: Metrics) -> None:
        self.settings = settings
        self.metrics = metrics
        n = settings.canary_probes
        self.probes = [self._body(t) for t in _texts(n, "probe")]
        self.filler = [self._body(t) for t in _texts(2 * n, "filler")]
        model = {"model": settings.model_name}
        self.images = [{**model, **_image(i)} for i in range(max(1, n // 2))]
        # identity's fingerprint id and the probes' path -> outputs
        self.references: dict[str, list[str]] = {}
        self._lock = asyncio.Lock()

    def _claimed(self, replica: Replica) -> bool:
        if self.settings.serialize is SerializeMode.ON or replica.identity is None:
            return False
        return capabilities_of(self.settings, replica.identity).pooling_invariant

    def _body(self, text: str) -> dict[str, Any]:
        return {"model": self.settings.model_name, "input": text}

    async def _post(self, client: httpx.AsyncClient, url: str, body: dict[str, Any]
                    ) -> httpx.Response:
        return await client.post(url, json=body, timeout=self.settings.request_timeout_s)

    async def _send(self, client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> str:
        r = await self._post(client, url, body)
        r.raise_for_status()
        return response_digest(r.json())

    async def _shape(self, client: httpx.AsyncClient, url: str
                     ) -> tuple[str, list[dict[str, Any]]]:
        """The path the model serves and the probes it takes (its first image, or not)."""
        if (await self._post(client, url + _CLASSIFY, self.probes[0])).status_code \
                not in _NOT_POOLING:
            return _CLASSIFY, self.probes
        r = await self._post(client, url + _EMBED, self.probes[0])
        if r.status_code in _NOT_POOLING:
            raise NotPooling(f"HTTP {r.status_code}")
        r.raise_for_status()
        takes_images = (await self._post(client, url + _EMBED, self.images[0])).status_code == 200
        return _EMBED, self.probes + (self.images if takes_images else [])

    async def __call__(self, replica: Replica, client: httpx.AsyncClient) -> str | None:
        replica.pooling_batched = False  # a restarted replica proves itself again
        if not self._claimed(replica):
            return None
        async with self._lock:  # one at a time: the reference must be settled first
            try:
                path, probes = await self._shape(client, replica.url)
                url = replica.url + path
                alone = [await self._send(client, url, b) for b in probes]
                mixed = await asyncio.gather(
                    *(self._send(client, url, b) for b in probes + self.filler))
            except NotPooling:
                return None
            except httpx.HTTPError as err:
                return f"pooling canary probe failed: {err!r}"
            return self._judge(replica, path, alone, list(mixed[: len(alone)]))

    def _which(self, alone: list[str], batched: list[str]) -> str:
        """The probes that changed, by kind: which tower of a dual encoder is not invariant."""
        texts = len(self.probes)
        changed = [i for i, (a, b) in enumerate(zip(alone, batched, strict=True)) if a != b]
        named = [f"text {i}" if i < texts else f"image {i - texts}" for i in changed]
        return ", ".join(named)

    def _judge(self, replica: Replica, path: str, alone: list[str], batched: list[str]
               ) -> str | None:
        assert replica.identity is not None, "only claimed (identified) replicas are probed"
        key = f"{replica.identity.fingerprint_id(self.settings.seed)} {path}"
        reference = self.references.setdefault(key, alone)
        if alone != reference:
            n = sum(a != r for a, r in zip(alone, reference, strict=True))
            self.metrics.violations.labels(source="canary").inc()
            problem = (f"{n}/{len(alone)} pooling probe outputs differ from the first admitted "
                       "replica's (alone): different numerics (dtype, model, engine?)")
            log.error("pooling canary: %s %s; refusing it", replica.name, problem)
            return f"pooling canary failed: {problem}"
        if batched != alone:
            n = sum(a != b for a, b in zip(alone, batched, strict=True))
            self.metrics.violations.labels(source="canary").inc()
            log.error("pooling canary: %d/%d outputs of %s change when co-batched (%s); its "
                      "pooling requests stay one at a time", n, len(alone), replica.name,
                      self._which(alone, batched))
            return None
        replica.pooling_batched = True
        log.info("pooling canary passed for %s (%d probes alone and co-batched): pooling "
                 "requests share batches", replica.name, len(alone))
        return None
