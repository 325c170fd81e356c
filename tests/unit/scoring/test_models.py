from __future__ import annotations

import pytest

from tests.support.scoring import request


def test_item_ids_must_be_unique() -> None:
    with pytest.raises(ValueError, match="appears twice"):
        request("judge", [{"id": "a"}, {"id": "a"}])
