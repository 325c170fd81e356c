from __future__ import annotations

import pytest

from grm_service.scoring.ocr import messages, normalize, ocr_score


@pytest.mark.parametrize(
    ("transcript", "reference", "expected"),
    [
        ("HELLO WORLD", "hello world", 1.0),  # case and whitespace do not count
        ("h e l l o\n\tworld", "HelloWorld", 1.0),
        ("Sure! The text is: hello world.", "hello world", 1.0),  # substring rule: distance 0
        ("hello wrld", "hello world", 1 - 1 / 10),  # one deletion over 10 characters
        ("hxllo", "hello", 1 - 1 / 5),
        ("", "abc", 0.0),  # everything missing: distance 3, capped at 3
        ("a completely different and much longer text", "abc", 0.0),  # capped at len(ref)
        ("abd", "abc", 1 - 1 / 3),
        ("", "", 1.0),  # empty reference: only an empty transcript is right
        ("   \n", "  ", 1.0),
        ("x", "", 0.0),
        ("x", " \t", 0.0),
    ],
)
def test_ocr_score(transcript: str, reference: str, expected: float) -> None:
    assert ocr_score(transcript, reference) == pytest.approx(expected)


def test_score_stays_in_unit_range() -> None:
    for hyp in ["", "a", "ab" * 50, "zzz"]:
        assert 0.0 <= ocr_score(hyp, "abc") <= 1.0


def test_normalize_removes_all_unicode_whitespace() -> None:
    assert normalize("A\u00a0B\u3000C\r\nD") == "abcd"


def test_request_is_the_verl_omni_prompt() -> None:
    msgs = messages("data:image/png;base64,AAAA")
    assert msgs[0] == {"role": "system", "content": "You are a helpful assistant."}
    parts = msgs[1]["content"]
    assert isinstance(parts, list)
    assert parts[0] == {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    assert parts[1]["text"] == ("Please output only the text content from the image without any "
                                "additional descriptions or formatting.")
