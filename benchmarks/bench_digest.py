"""CPU per response digest: the C encoder's canonical JSON against `canonical_value`'s msgspec
form, on what `fingerprint.produced` takes from an answer (the same bytes either way; this
checks it on every answer it times).

Answers: cpu_inprocess.py's OCR answer (128 tokens with logprobs, most of them confident:
logprobs near 0, in the ranges whose layout is rewritten), the same with 5 top logprobs per
token, and a short judge answer without logprobs. Each is timed in turn, `--repeat` times,
the minimum of each kept (per call, us). Two more columns time what the proxy runs on an
engine's answer: its parse (`jsonload.loads_strict`, msgspec) and `canonical_value` of the
value that parse built (`decoded`: the quotes' parity instead of the read-back where it holds).

    .venv/bin/python benchmarks/bench_digest.py [--repeat 7] [--number 300] [--answers FILE]

`--answers FILE`: more rows, an engine's own answers (one JSON string of its bytes a line, as
`gpu/bench_gateway_gpu.py --keep-answers` writes them), timed the same way.
"""

from __future__ import annotations

import argparse
import json
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stub_server import logprobs_answer

from grm_service.canonical import canonical_json, canonical_value
from grm_service.fingerprint import produced
from grm_service.jsonload import loads_strict


def _with_top(value: list[dict[str, Any]], k: int) -> list[dict[str, Any]]:
    for entry in value[0]["logprobs"]["content"]:
        entry["top_logprobs"] = [{"token": entry["token"], "logprob": entry["logprob"] * (i + 1),
                                  "bytes": entry["bytes"]} for i in range(k)]
    return value


def answers() -> dict[str, dict[str, Any]]:
    """The engines' answers; `produced` of each is what the digest covers."""
    top = json.loads(logprobs_answer(128))
    _with_top(produced(top), 5)  # its entries are the answer's own: the answer gets them
    judge = {"choices": [{"index": 0, "logprobs": None, "message": {
        "role": "assistant", "content": "Score: 7. The answer is correct but terse."}}]}
    return {"OCR, 128 logprobs": json.loads(logprobs_answer(128)),
            "OCR, 128 logprobs x 5 top": top, "judge, no logprobs": judge}


def _time(fn: Callable[[], bytes], repeat: int, number: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--number", type=int, default=300)
    parser.add_argument("--answers", type=Path, default=None, metavar="FILE",
                        help="an engine's answers, one JSON string of its bytes a line")
    args = parser.parse_args()
    kept = answers()
    if args.answers is not None:
        for i, line in enumerate(args.answers.read_text().splitlines()):
            kept[f"{args.answers.name} #{i}"] = json.loads(json.loads(line))
    print("| answer | bytes | C encoder us | canonical_value us | ratio | parse (msgspec) us "
          "| canonical_value, decoded us |")
    print("|---|---|---|---|---|---|---|")
    for name, answer in kept.items():
        value = produced(answer)
        want = canonical_json(value)
        assert canonical_value(value) == want, name
        slow = _time(lambda v=value: canonical_json(v), args.repeat, args.number)
        fast = _time(lambda v=value: canonical_value(v), args.repeat, args.number)
        engine = json.dumps(answer, ensure_ascii=False, separators=(",", ":")).encode()
        parsed, strict = loads_strict(engine)
        assert strict and canonical_value(produced(parsed), decoded=True) == want, name
        parse = _time(lambda e=engine: loads_strict(e), args.repeat, args.number)
        seen = produced(parsed)
        proven = _time(lambda v=seen: canonical_value(v, decoded=True), args.repeat,
                       args.number)
        print(f"| {name} | {len(want):,} | {slow:.1f} | {fast:.1f} | {slow / fast:.2f}x "
              f"| {parse:.1f} | {proven:.1f} |")
    more = f" --answers {args.answers}" if args.answers is not None else ""
    print(f"\nrerun: .venv/bin/python benchmarks/bench_digest.py --repeat {args.repeat} "
          f"--number {args.number}{more}")


if __name__ == "__main__":
    main()
