"""The identity a replica reports, as the keeper compares it: each difference named."""

from __future__ import annotations

from grm_service.engine_side.identity import ReplicaIdentity
from tests.unit.replicas.test_keeper import identity


def test_identity_differences_name_the_part() -> None:
    a = ReplicaIdentity.model_validate(identity())
    b = ReplicaIdentity.model_validate(identity(engine_version="0.26.0", device="NVIDIA A100"))
    diffs = " ; ".join(a.differences(b))
    assert "engine version '0.25.0' != '0.26.0'" in diffs and "device" in diffs
    assert a.fingerprint_id(1) == ReplicaIdentity.model_validate(identity()).fingerprint_id(1)
