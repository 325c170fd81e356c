"""Settings renamed in this release, still read under their old names for one release, each use
warned about with the name to use instead.

The old env var is read by a settings source of its own, after the new one: `AliasChoices`
would read both variables, but hands the validators the value under one key, so nobody could
tell the user which old name they set. The old field name is accepted where a `Settings` is built
in code (`Settings(backend_urls=...)`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

log = logging.getLogger("grm_service.config")

# old field -> new field; each env var is GRM_<FIELD>.
RENAMED_FIELDS = {
    "backend_urls": "replica_urls",
    "backend_ack_timeout_s": "replica_ack_timeout_s",
}


def env_var(field: str) -> str:
    return f"GRM_{field.upper()}"


def warn_renamed(old: str, new: str) -> None:
    log.warning("%s is deprecated and will be removed in the next release: use %s", old, new)


class RenamedEnvSource(PydanticBaseSettingsSource):
    """GRM_<OLD> read as GRM_<NEW>'s value, with a warning; GRM_<NEW>, when also set, wins
    (this source comes after the env source)."""

    def __init__(self, settings_cls: type[BaseSettings],
                 environ: Mapping[str, str] | None = None) -> None:
        super().__init__(settings_cls)
        # Env var names are case-insensitive, as the settings' own env source reads them.
        given = os.environ if environ is None else environ
        self.environ = {name.upper(): value for name, value in given.items()}

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # every value comes through __call__

    def __call__(self) -> dict[str, Any]:
        found: dict[str, Any] = {}
        for old, new in RENAMED_FIELDS.items():
            value = self.environ.get(env_var(old))
            if value is not None:
                warn_renamed(env_var(old), env_var(new))
                found[new] = value
        return found


def renamed_kwargs(data: object) -> object:
    """A `Settings(...)` built under an old field name, as if under the new one (warned)."""
    if not isinstance(data, dict) or not any(old in data for old in RENAMED_FIELDS):
        return data
    data = dict(data)
    for old, new in RENAMED_FIELDS.items():
        if old in data:
            warn_renamed(f"the setting {old!r}", repr(new))
            value = data.pop(old)
            data.setdefault(new, value)
    return data
