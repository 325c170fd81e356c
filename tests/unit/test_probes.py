"""`verify --manifest`: a manifest of real items read line by line, and a bad one refused with its
line named before any request is sent."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from grm_service import cli
from grm_service.probes import builtin_probes, load_manifest


def test_a_manifest_is_one_body_per_line_and_blank_lines_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / "items.jsonl"
    path.write_text('{"messages": [{"role": "user", "content": "a"}], "seed": 3}\n\n'
                    '{"messages": [], "max_tokens": 8}\n')
    assert load_manifest(path) == [
        {"messages": [{"role": "user", "content": "a"}], "seed": 3},
        {"messages": [], "max_tokens": 8},
    ]


@pytest.mark.parametrize(("text", "says"), [
    ('{"messages": []}\n{"messages": [\n', "items.jsonl:2: not JSON"),
    ('["messages"]\n', "items.jsonl:1: expected an object with a 'messages' list"),
    ('{"prompt": "hi"}\n', "items.jsonl:1: expected an object with a 'messages' list"),
    ("\n  \n", "items.jsonl: no probe items"),
])
def test_a_bad_manifest_is_refused_naming_its_line(tmp_path: Path, text: str, says: str) -> None:
    path = tmp_path / "items.jsonl"
    path.write_text(text)
    with pytest.raises(ValueError, match=says):
        load_manifest(path)
    # The CLI: a usage error naming the option and the line; nothing is sent to the URL (no
    # service listens there).
    done = CliRunner().invoke(cli.app, ["verify", "--url", "http://127.0.0.1:9",
                                        "--manifest", str(path)])
    assert done.exit_code == 2, done.output
    assert "--manifest" in done.output and says.split(":")[-1].strip()[:20] in done.output


def test_builtin_probes_take_the_token_limit_asked_for() -> None:
    probes = builtin_probes(3, max_tokens=5)
    assert [p["max_tokens"] for p in probes] == [5, 5, 5]
    assert len({p["messages"][0]["content"] for p in probes}) == 3
    assert builtin_probes(1)[0]["max_tokens"] == 24
