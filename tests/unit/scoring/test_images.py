from __future__ import annotations

import base64

import pytest

from grm_service.scoring.context import ItemError
from grm_service.scoring.images import to_data_url
from tests.support.scoring import png


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("https://example.com/a.png", "not a URL"),
        ("file:///etc/passwd", "not a URL"),
        ("%%%", "neither a data URL nor base64"),
        ("", "neither a data URL nor base64"),
    ],
)
def test_images_that_cannot_be_data_urls_are_named(value: str, message: str) -> None:
    with pytest.raises(ItemError, match=message):
        to_data_url(value)


def test_images_keep_their_bytes_and_get_a_mime_type() -> None:
    raw = png()
    url = to_data_url(base64.b64encode(raw).decode())
    assert url.startswith("data:image/png;base64,")
    assert base64.b64decode(url.split(",", 1)[1]) == raw
