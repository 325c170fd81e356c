"""The request bodies the load generator sends, by name (`loadgen.Load.body`):

- `short`: the benchmark's own 120-byte body (one user message, seed, max_tokens 8,
  temperature 0), 256 distinct ones; built by loadgen.lua itself.
- `judge`: a judge request as a trainer's reward client sends it: four messages (system,
  question, candidate answer, "grade it"), ~1.1 KB, temperature 0.7, top_p 0.9, max_tokens 64,
  n 1, stream false, serialised as `json.dumps` does (httpx's and aiohttp's `json=`); 8
  distinct bodies cycling.
- `sdk`: what the OpenAI Python SDK sends for `client.chat.completions.create(model=...,
  messages=...)` with nothing else given: its compact body and its own headers (user-agent,
  accept, the x-stainless-* lines; openai 3.63.0), for the judge's four messages; 8 cycling.

For `judge` and `sdk` the requests are written to a file that loadgen.lua reads: each is its
header lines, an empty line, the body, and requests are separated by a NUL byte.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

KINDS = ("short", "judge", "sdk")
DISTINCT = 8

SYSTEM = ("You are a strict grader of answers to grade-school mathematics questions. Read the "
          "question and the candidate answer, check every step of the reasoning and the final "
          "number, and reply with a single integer score from 0 (wrong) to 10 (fully correct "
          "and clearly argued), with no other text.")
QUESTION = ("A baker makes {n} loaves every morning and sells three quarters of them by noon. "
            "In the afternoon she sells half of what is left, and gives the rest to a shelter. "
            "How many loaves does the shelter get each day, and how many is that over a week of "
            "seven days?")
ANSWER = ("By noon the baker sells 3/4 of {n}, which is {sold} loaves, so {left} are left. In "
          "the afternoon she sells half of those, {half} loaves, and the remaining {half} go to "
          "the shelter. Over seven days the shelter therefore receives 7 x {half} = {week} "
          "loaves. Final answer: {half} loaves a day and {week} loaves a week.")
GRADE = "Grade the candidate answer above. Reply with the score only."
# The headers the OpenAI Python SDK (3.63.0) adds to a request, past host and content-length.
SDK_HEADERS = [
    ("Accept-Encoding", "gzip, deflate"), ("Connection", "keep-alive"),
    ("authorization", "Bearer sk-bench"), ("accept", "application/json"),
    ("content-type", "application/json"), ("user-agent", "OpenAI/Python 3.63.0"),
    ("x-stainless-lang", "python"), ("x-stainless-package-version", "3.63.0"),
    ("x-stainless-os", "Linux"), ("x-stainless-arch", "x64"),
    ("x-stainless-runtime", "CPython"), ("x-stainless-runtime-version", "3.11.7"),
    ("x-stainless-async", "false"), ("x-stainless-retry-count", "0"),
    ("x-stainless-read-timeout", "600"),
]
PLAIN_HEADERS = [("Content-Type", "application/json")]


def messages(i: int) -> list[dict[str, str]]:
    n = 48 + 8 * i
    sold, left = 3 * n // 4, n - 3 * n // 4
    half = left // 2
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": QUESTION.format(n=n)},
        {"role": "assistant", "content": ANSWER.format(n=n, sold=sold, left=left, half=half,
                                                       week=7 * half)},
        {"role": "user", "content": GRADE},
    ]


def judge(i: int, model: str) -> bytes:
    body: dict[str, Any] = {"model": model, "messages": messages(i), "temperature": 0.7,
                            "top_p": 0.9, "max_tokens": 64, "n": 1, "stream": False}
    return json.dumps(body).encode()


def sdk(i: int, model: str) -> bytes:
    """The SDK's body: the arguments given, in its order, compact."""
    return json.dumps({"model": model, "messages": messages(i)},
                      separators=(",", ":")).encode()


def requests(kind: str, model: str) -> list[tuple[list[tuple[str, str]], bytes]]:
    """(headers, body) of each distinct request of `kind` (not `short`)."""
    if kind == "judge":
        return [(PLAIN_HEADERS, judge(i, model)) for i in range(DISTINCT)]
    if kind == "sdk":
        return [(SDK_HEADERS, sdk(i, model)) for i in range(DISTINCT)]
    raise ValueError(f"no body file for {kind!r}: one of {KINDS[1:]}")


def write(kind: str, model: str) -> Path:
    """The file loadgen.lua reads the requests of `kind` from."""
    blocks = []
    for headers, body in requests(kind, model):
        lines = "".join(f"{name}: {value}\n" for name, value in headers)
        blocks.append(lines.encode() + b"\n" + body)
    with tempfile.NamedTemporaryFile("wb", prefix=f"bodies-{kind}-", suffix=".bin",
                                     delete=False) as f:
        f.write(b"\0".join(blocks))
    return Path(f.name)

