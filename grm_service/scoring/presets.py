"""Named scorer presets: an operator's file of judge templates, patterns, ranges and sampling.

    # GRM_SCORER_PRESETS=/etc/grm/presets.yaml (YAML or JSON, by suffix)
    math-judge:
      scorer: judge
      options: {min: 0, max: 10, pattern: "(?i)final score:\\s*(\\d+)"}
      sampling: {max_tokens: 256}

A preset is selected like a scorer, by its name: `{"scorer": "math-judge"}` on `/v1/score`,
`?scorer=math-judge` in OpenRLHF's URL, `scorer="math-judge"` in every adapter. It is the one way
to give judge options where a trainer's configuration cannot carry them (OpenRLHF's URL is split
on commas). A request's own `options` and `sampling` override the preset's, key by key.

The file is read once, when the service starts: a preset that names an unknown scorer, shadows a
scorer, or whose options the scorer refuses, fails start-up instead of the first request.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from grm_service.errors import ConfigError, InvalidRequest
from grm_service.scoring.models import ScoreRequest
from grm_service.scoring.registry import check_option_set, registered


class Preset(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    scorer: str = Field(min_length=1, description="The scorer this preset configures.")
    options: dict[str, Any] = Field(default_factory=dict)
    sampling: dict[str, Any] = Field(default_factory=dict)
    description: str = ""


Presets = dict[str, Preset]


def parse(text: str, suffix: str) -> Presets:
    """Presets from a file's text; ConfigError naming the preset and field that are wrong."""
    try:
        data = json.loads(text) if suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as err:
        raise ConfigError(f"scorer presets cannot be parsed: {err}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError("scorer presets must be a mapping of name -> {scorer, options, "
                          f"sampling}}, not {type(data).__name__}")
    presets: Presets = {}
    for name, body in data.items():
        try:
            presets[str(name)] = Preset.model_validate(body)
        except ValidationError as err:
            raise ConfigError(f"scorer preset {name!r}: {err}") from None
    return presets


@functools.cache
def load(path: Path | None) -> Presets:
    """The presets of `path` (None: none), read once per process."""
    if path is None:
        return {}
    try:
        text = path.read_text()
    except OSError as err:
        raise ConfigError(f"cannot read scorer presets {path}: {err}") from None
    return parse(text, path.suffix.lower())


def resolve(req: ScoreRequest, presets: Presets) -> tuple[str, ScoreRequest]:
    """(the scorer to run, the request with the preset's options and sampling under its own).
    A request that names no preset is returned as it is."""
    preset = presets.get(req.scorer)
    if preset is None:
        return req.scorer, req
    merged = req.model_copy(update={"options": {**preset.options, **req.options},
                                    "sampling": {**preset.sampling, **req.sampling}})
    return preset.scorer, merged


def scorer_names(path: Path | None, specs: tuple[str, ...] = ()) -> list[str]:
    """Every name a request may give as `scorer`: the scorers, then the presets, each preset
    checked: it names a registered scorer, shadows none, and its options pass that scorer's
    check. ConfigError otherwise (start-up calls this)."""
    scorers = registered(specs)
    found = load(path)
    for name, preset in found.items():
        if name in scorers:
            raise ConfigError(f"scorer preset {name!r} has the name of a scorer; rename it")
        if preset.scorer not in scorers:
            raise ConfigError(f"scorer preset {name!r} uses scorer {preset.scorer!r}, which is "
                              f"not registered; registered: {', '.join(scorers)}")
        try:
            check_option_set(preset.scorer, preset.options, specs)
        except InvalidRequest as err:
            raise ConfigError(f"scorer preset {name!r}: {err}") from None
    return [*scorers, *sorted(found)]
