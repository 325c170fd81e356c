"""`replayer.compare`: a re-sent request's answer against its record, and why they differ."""

from __future__ import annotations

import json
from typing import Any

from grm_service.commands.replayer import Report, compare
from grm_service.fingerprint import response_digest
from grm_service.ledger.records import Origin, Record

FIELDS = {"fingerprint_id": "grm-a", "identity": "verified", "seed": 42, "model_hash": "m",
          "env_digest": "e", "engine": "vllm", "engine_version": "0.25.0", "device": "H200",
          "replica": "r0", "serialized": False, "request_digest": "q"}


def answer(text: str) -> dict[str, Any]:
    return {"id": "x", "choices": [{"index": 0, "message": {"content": text},
                                    "logprobs": {"content": [{"logprob": -0.25}]}}]}


def record(text: str = "4") -> Record:
    payload = answer(text)
    digest = response_digest(payload)
    return Record(0.0, Origin("/v1/score", run="r"), "/v1/chat/completions", "grm-a", "q",
                  digest, b"{}", json.dumps(payload).encode(),
                  {**FIELDS, "response_digest": digest}, id=7)


def served(text: str, **fields: Any) -> bytes:
    payload = answer(text)
    payload["grm_fingerprint"] = {**FIELDS, **fields, "response_digest": "whatever"}
    payload["id"] = "another id"  # not produced by the model: never compared
    return json.dumps(payload).encode()


def test_the_same_output_matches_whatever_else_changed() -> None:
    assert compare(record(), 200, served("4", engine_version="0.26.0")).matched


def test_a_difference_is_explained_by_the_first_differing_part() -> None:
    newer = compare(record(), 200, served("5", engine_version="0.26.0", device="H100"))
    assert not newer.matched and newer.cause == "engine version differs"
    same = compare(record(), 200, served("5"))
    assert same.cause.startswith("same fingerprint, different output")
    logprob = answer("4")
    logprob["choices"][0]["logprobs"]["content"][0]["logprob"] = -0.2500001
    logprob["grm_fingerprint"] = FIELDS
    assert not compare(record(), 200, json.dumps(logprob).encode()).matched  # bits, not text


def test_errors_and_cached_answers_are_never_matches() -> None:
    assert compare(record(), 503, b"down").cause == "HTTP 503"
    assert compare(record(), 200, b"<html>").cause == "answer is not a grm-service answer"
    hit = compare(record(), 200, served("4", cache="hit"))
    assert not hit.matched and "ledger" in hit.cause


def test_the_report_is_complete_only_when_every_answer_matched() -> None:
    report = Report()
    assert not report.ok  # nothing replayed proves nothing
    report.add(compare(record(), 200, served("4")))
    assert report.ok
    report.add(compare(record(), 200, served("5")))
    assert not report.ok and report.by_run == {"r": [1, 2]}
