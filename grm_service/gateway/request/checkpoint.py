"""The checkpoint: every body the gateway sends to an engine passes here first.

    limits = Limits.from_settings(settings)        # once, at start-up
    check_body(path, body, limits) -> None         # per outgoing body; raises, never returns data

`check_body` is pure (no I/O, no globals, no settings lookup) and raises only `InvalidRequest`
subclasses from `grm_service.errors` (mapped to 400 there), so the proxy, the scorers' sends, the
audit's re-runs and any faster forwarding path all call this one function and refuse alike. The
canary is not checked: it builds its own bodies. `scan` + `check_images` are the same check in
two halves, for a caller that wants the image bytes checked off its event loop.

What passes, for `/v1/chat/completions`, `/v1/responses`, `/classify` and `/v1/embeddings`
bodies:
- **top-level fields**: anything but `DENIED` (fields that make the engine run client code or
  reach outside the request); `seed` an integer in [0, 2**63-1] (what the engine accepts; a
  float or a bool would be forwarded as-is while the fingerprint claimed an integer);
  `n`, `best_of` <= `max_n` and `max_tokens`, `max_completion_tokens`, `min_tokens`,
  `max_output_tokens` <= `max_tokens`, each an integer.
- **the Responses API's state** (`RESPONSES_DENIED`): none; its `input` items' parts are typed
  by `type`: text kinds pass, `input_image` is checked as below, nothing else passes.
- **content parts**, by allow-list: `text` ({type, text}), `image_url` ({type, image_url: {url,
  detail?}}) and `input_image` ({type, image_url: url, detail?}); no other part type and no
  other key (vLLM infers a part's type from its keys, and keys such as `uuid` steer its cache).
- **URLs**: a data URL is an inline image, decoded and checked by `images` against
  the one set of image limits (chat and score alike). Any other URL is parsed (scheme, userinfo,
  host, port, path) and must equal an allow-list entry exactly: same scheme, same host (no
  suffix or prefix match), same port (the scheme's default when absent), no userinfo, and a
  path equal to or below the entry's path by whole segments; backslashes, control characters
  and `.`/`..` segments are refused (the engine's HTTP client would resolve them differently).

`check_sampling` is the rule for a `/v1/score` request's `sampling` (merged into every item's
body): only `SAMPLING_FIELDS`, so a client cannot replace a scorer's messages or model.
`shape.check_json_shape` bounds nesting depth and value count on the raw bytes, before any
parser builds (or recurses into) them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import SplitResult, unquote, urlsplit

from grm_service.config import Settings
from grm_service.errors import (
    ConfigError,
    FieldNotAllowed,
    ImageError,
    InvalidRequest,
    OverLimit,
)
from grm_service.gateway.request.images import (
    ImageLimits,
    check_image,
    data_url_payload,
    decode_base64,
)
from grm_service.gateway.request.longstrings import Lifted
from grm_service.mime import is_data_url

SEED_MAX = 2**63 - 1
CHAT_PATH = "/v1/chat/completions"
RESPONSES_PATH = "/v1/responses"
FORWARDED_PATHS = frozenset({CHAT_PATH, RESPONSES_PATH, "/classify", "/pooling",
                             "/v1/embeddings"})
DENIED = {
    "chat_template": "a client-supplied chat template runs in the engine",
    "logits_processors": "it loads code into the engine",
    "kv_transfer_params": "it reaches other engines' caches",
}
# The Responses API's state lives in one replica's memory: an answer built on it would depend on
# which replica kept what, not on the request.
RESPONSES_DENIED = {
    "previous_response_id": "a stored response lives on one replica; send the whole "
                            "conversation in `input`",
    "conversation": "a stored conversation lives on one replica; send it in `input`",
    "background": "an answer is given in full, with its fingerprint, or not at all",
}
SAMPLING_FIELDS = frozenset({
    "temperature", "top_p", "top_k", "min_p", "seed", "max_tokens", "max_completion_tokens",
    "min_tokens", "presence_penalty", "frequency_penalty", "repetition_penalty", "stop",
    "stop_token_ids", "skip_special_tokens", "include_stop_str_in_output",
})
# `sampling` and `options` are copied into every item's request: bounded, or a small body
# multiplies into items x their size.
MAX_SHARED_BYTES = 64 * 1024
_PART_KEYS = {"text": {"type", "text"}, "image_url": {"type", "image_url"},
              "input_image": {"type", "image_url", "detail"}}
_DEFAULT_PORTS = {"http": 80, "https": 443}
_UNSAFE = re.compile(r"[\x00-\x20\x7f\\]")
# The Responses API's parts are typed by `type` alone: text kinds pass, an image is checked like
# chat's, anything else (files, audio) is refused.
_RESPONSES_TEXT = frozenset({"input_text", "output_text", "reasoning_text", "summary_text",
                             "refusal"})
_COUNT_CAPS = ("n", "best_of")
_TOKEN_CAPS = ("max_tokens", "max_completion_tokens", "min_tokens", "max_output_tokens")


@dataclass(frozen=True)
class Origin:
    """One parsed allow-list entry: what a remote URL must equal, part by part."""

    scheme: str
    host: str
    port: int
    path: str

    @classmethod
    def parse(cls, entry: str) -> Origin:
        try:
            parts = _parse_url(entry)
        except InvalidRequest as err:
            raise ConfigError(f"image URL allow-list entry {entry!r}: {err.message}") from None
        if parts.query or parts.fragment:
            raise ConfigError(f"image URL allow-list entry {entry!r} must have no ?query/#frag")
        return cls(parts.scheme, _host(parts), _port(parts), parts.path.rstrip("/"))

    def admits(self, parts: SplitResult) -> bool:
        if (parts.scheme, _host(parts), _port(parts)) != (self.scheme, self.host, self.port):
            return False
        return not self.path or parts.path == self.path or parts.path.startswith(self.path + "/")


@dataclass(frozen=True)
class Limits:
    """The operator's caps, parsed once; what `check_body` compares against."""

    images: ImageLimits
    allowlist: tuple[Origin, ...] = ()
    max_n: int = 16
    max_tokens: int = 32768

    @classmethod
    def from_settings(cls, settings: Settings) -> Limits:
        images = ImageLimits(settings.max_image_bytes, settings.max_image_pixels,
                             settings.image_decode)
        allowlist = tuple(Origin.parse(entry) for entry in settings.image_url_allowlist)
        return cls(images, allowlist, settings.max_n, settings.max_tokens_limit)


def check_body(path: str, body: Mapping[str, Any], limits: Limits) -> None:
    """Refuse (InvalidRequest and subclasses) whatever the module docstring does not admit."""
    check_images(scan(path, body, limits), limits)


def scan(path: str, body: Mapping[str, Any], limits: Limits) -> list[str]:
    """Every check except decoding inline images; returns those images' data URLs."""
    if path not in FORWARDED_PATHS:
        raise InvalidRequest(f"{path} is not a path the gateway forwards")
    check_options(body, limits)
    if path == RESPONSES_PATH:
        return _responses_images(body, limits)
    messages = body.get("messages")
    if messages is None:
        return []
    if not isinstance(messages, list):
        raise InvalidRequest("messages must be a list of message objects")
    inline: list[str] = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise InvalidRequest(f"messages[{i}] must be an object")
        content = message.get("content")
        if content is not None and not isinstance(content, str):
            inline += _content_images(f"messages[{i}]", content, limits)
    return inline


def _responses_images(body: Mapping[str, Any], limits: Limits) -> list[str]:
    """A Responses API body's denied fields and its input's images (data URLs returned)."""
    if not RESPONSES_DENIED.keys().isdisjoint(body):
        reasons = "; ".join(f"{name}: {RESPONSES_DENIED[name]}"
                            for name in sorted(RESPONSES_DENIED) if name in body)
        raise FieldNotAllowed(f"field(s) not accepted: {reasons}")
    given = body.get("input")
    if given is None or isinstance(given, str):
        return []
    if not isinstance(given, list):
        raise InvalidRequest("input must be a string or a list of input items")
    inline: list[str] = []
    for i, item in enumerate(given):
        if not isinstance(item, dict):
            raise InvalidRequest(f"input[{i}] must be an object")
        for key in ("content", "output"):  # a message's parts; a tool output's, as parts
            parts = item.get(key)
            if isinstance(parts, list):
                inline += _response_parts(f"input[{i}].{key}", parts, limits)
    return inline


def _response_parts(where: str, parts: list[Any], limits: Limits) -> list[str]:
    inline = []
    for j, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, dict) else None
        if isinstance(kind, str) and kind in _RESPONSES_TEXT:
            continue
        if kind != "input_image":
            raise FieldNotAllowed(f"{where}[{j}]: part type {_short(kind)} is not accepted; "
                                  f"accepted: input_image, {', '.join(sorted(_RESPONSES_TEXT))}")
        url = _part_url(f"{where}[{j}]", part)
        if url is not None and is_data_url(url):
            inline.append(url)
        elif url is not None:
            check_remote_url(url, limits.allowlist)
    return inline


def check_images(urls: Iterable[str], limits: Limits, lifted: Lifted | None = None) -> None:
    """`lifted`: the URLs' bytes in the body read (`longstrings.loads`), decoded uncopied."""
    for url in urls:
        source = None if lifted is None else lifted.bytes_of(url)
        raw = decode_base64(data_url_payload(url, source), limits.images.max_bytes)
        check_image(raw, limits.images)


def check_options(body: Mapping[str, Any], limits: Limits) -> None:
    """Denied fields, the seed and the operator's caps on one body's top-level options."""
    if not DENIED.keys().isdisjoint(body):
        reasons = "; ".join(f"{name}: {DENIED[name]}" for name in sorted(DENIED) if name in body)
        raise FieldNotAllowed(f"field(s) not accepted: {reasons}")
    check_seed(body.get("seed"))
    for name in _COUNT_CAPS:
        if name in body:
            _check_cap(name, body[name], limits.max_n, "GRM_MAX_N")
    for name in _TOKEN_CAPS:
        if name in body:
            _check_cap(name, body[name], limits.max_tokens, "GRM_MAX_TOKENS_LIMIT")


def check_seed(seed: Any) -> None:
    """`None` (the service seed is used) or an integer in the engine's range."""
    if seed is None:
        return
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise InvalidRequest(f"seed must be an integer, not {type(seed).__name__} "
                             f"{_short(seed)}")
    if not 0 <= seed <= SEED_MAX:
        raise InvalidRequest(f"seed {seed} is outside [0, {SEED_MAX}]")


def check_sampling(sampling: Mapping[str, Any], limits: Limits) -> None:
    """A score request's `sampling`: allow-listed keys, checked values, bounded size."""
    refused = sorted(set(sampling) - SAMPLING_FIELDS)
    if refused:
        raise FieldNotAllowed(f"sampling may not set {', '.join(refused)}; allowed: "
                              f"{', '.join(sorted(SAMPLING_FIELDS))}")
    check_options(sampling, limits)
    check_shared_size("sampling", sampling)


def check_shared_size(name: str, value: Any) -> None:
    size = len(json.dumps(value))
    if size > MAX_SHARED_BYTES:
        raise OverLimit(f"{name} is {size} bytes of JSON; the limit is {MAX_SHARED_BYTES} "
                        "(it is copied into every item's request)")


def _check_cap(name: str, value: Any, cap: int, setting: str) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequest(f"{name} must be an integer, not {type(value).__name__}")
    if value > cap:
        raise OverLimit(f"{name}={value} is above this service's cap of {cap} ({setting})")


def _content_images(where: str, content: Any, limits: Limits) -> list[str]:
    if not isinstance(content, list):
        raise InvalidRequest(f"{where}.content must be a string or a list of content parts")
    inline = []
    for j, part in enumerate(content):
        url = _part_url(f"{where}.content[{j}]", part)
        if url is None:
            continue
        if is_data_url(url):
            inline.append(url)
        else:
            check_remote_url(url, limits.allowlist)
    return inline


def _part_url(where: str, part: Any) -> str | None:
    """A part's URL (None for text); refuses part types and keys outside the allow-list."""
    if not isinstance(part, dict):
        raise InvalidRequest(f"{where} must be an object with a `type`")
    kind = part.get("type")
    allowed = _PART_KEYS.get(kind) if isinstance(kind, str) else None
    if allowed is None:
        raise FieldNotAllowed(f"{where}: content part type {_short(kind)} is not accepted; "
                              f"accepted: {', '.join(_PART_KEYS)}")
    extra = sorted(set(part) - allowed)
    if extra:
        raise FieldNotAllowed(f"{where}: key(s) {', '.join(extra)} not accepted in a {kind} part")
    if kind == "text":
        if not isinstance(part.get("text"), str):
            raise InvalidRequest(f"{where}.text must be a string")
        return None
    ref = part.get("image_url")
    if kind == "image_url":
        if not isinstance(ref, dict) or set(ref) - {"url", "detail"}:
            raise InvalidRequest(f"{where}.image_url must be {{\"url\": ..., \"detail\"?: ...}}")
        ref = ref.get("url")
    if not isinstance(ref, str):
        raise InvalidRequest(f"{where}: the image URL must be a string")
    return ref


def check_remote_url(url: str, allowlist: tuple[Origin, ...]) -> None:
    """A non-data URL the engine would fetch: admitted only by an exact allow-list entry."""
    parts = _parse_url(url)
    if not any(origin.admits(parts) for origin in allowlist):
        raise ImageError(
            f"remote image URL {_short(url)} is refused: the engine would fetch it from inside "
            "the cluster (server-side request forgery); send the image inline as a data URL, "
            "or have the operator add its origin to GRM_IMAGE_URL_ALLOWLIST"
        )


def _parse_url(url: str) -> SplitResult:
    if _UNSAFE.search(url):
        raise ImageError("image URL contains whitespace, control characters or backslashes")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (parsing the port is the check: it raises when malformed)
    except ValueError as err:
        raise ImageError(f"image URL cannot be parsed: {err}") from None
    if parts.scheme not in _DEFAULT_PORTS:
        raise ImageError(f"image URL scheme {parts.scheme!r} is refused: only http(s) or data")
    if "@" in parts.netloc:
        raise ImageError("image URL must not carry user info (user@host)")
    if not parts.hostname:
        raise ImageError("image URL has no host")
    segments = unquote(parts.path).split("/")
    if "." in segments or ".." in segments:
        raise ImageError("image URL path must not contain . or .. segments")
    return parts


def _host(parts: SplitResult) -> str:
    return (parts.hostname or "").rstrip(".")


def _port(parts: SplitResult) -> int:
    return parts.port or _DEFAULT_PORTS[parts.scheme]


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
