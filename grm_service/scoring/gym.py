"""NeMo Gym's verify request as a score item, and the reward back as Gym's verify response.

A Gym resources server answers `POST /verify` with `BaseVerifyRequest` (`responses_create_params`:
the Responses API request the policy was asked; `response`: its Responses API answer) and returns
the same body plus `reward`. Gym's agents copy every field of the dataset row into that body, so
the reference answer comes as a top-level field (`expected_answer` in Gym's own datasets), and
Gym's rollout collection adds `_ng_task_index` (which row: the group of its repeats) and
`_ng_rollout_index` (which repeat).

    item = item_of(body, reference_field="expected_answer", group_size=None)

- prompt: the text of the request's user messages (`input` as a string is one), joined by blank
  lines; system and developer messages are the policy's instructions, not the task;
- completion: the text of the answer's assistant messages (`output_text` parts), joined by
  newlines; reasoning items and tool calls are left out (an answer without text is judged as
  the empty string);
- reference: the field named by `reference_field`, a string or a number;
- id: `_ng_rollout_index` where Gym sent it, else `rollout`; an id never depends on arrival;
- group: `group_id` and `group_size` where the body has them; else, with a `group_size` from the
  server's setting, the Gym task (`_ng_task_index`) is the group.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pydantic import ValidationError

from grm_service.errors import InvalidRequest
from grm_service.scoring.models import ScoreItem

TASK_INDEX = "_ng_task_index"
ROLLOUT_INDEX = "_ng_rollout_index"
_USER = "user"
_INPUT_TEXT = ("input_text", "text")
_OUTPUT_TEXT = ("output_text", "text")


def item_of(body: dict[str, Any], reference_field: str, group_size: int | None) -> ScoreItem:
    """The score item of one verify body; InvalidRequest naming the field to fix."""
    params = _object(body, "responses_create_params")
    response = _object(body, "response")
    fields: dict[str, Any] = {
        "id": _item_id(body.get(ROLLOUT_INDEX)),
        "prompt": prompt_of(params),
        "completion": completion_of(response),
        "reference": _reference(body, reference_field),
        **_group(body, group_size),
    }
    try:
        return ScoreItem(**fields)
    except ValidationError as err:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors())
        raise InvalidRequest(f"the verify request does not make a score item: {problems}") from None


def prompt_of(params: dict[str, Any]) -> str:
    """The user's text of a Responses API request."""
    given = params.get("input")
    if isinstance(given, str):
        return given
    if not isinstance(given, list):
        raise InvalidRequest("responses_create_params.input must be a string or a list of "
                             "input items")
    texts = [text for where, item in _items(given, "responses_create_params.input")
             if item.get("role") == _USER
             for text in _texts(where, item.get("content"), _INPUT_TEXT)]
    return "\n\n".join(texts)


def completion_of(response: dict[str, Any]) -> str:
    """The assistant's text of a Responses API answer."""
    output = response.get("output")
    if not isinstance(output, list):
        raise InvalidRequest("response.output must be a list of output items (a Responses API "
                             "answer)")
    texts = [text for where, item in _items(output, "response.output")
             if item.get("type", "message") == "message" and item.get("role") == "assistant"
             for text in _texts(where, item.get("content"), _OUTPUT_TEXT)]
    return "\n".join(texts)


def _items(items: list[Any], where: str) -> Iterator[tuple[str, dict[str, Any]]]:
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise InvalidRequest(f"{where}[{i}] must be an object")
        yield f"{where}[{i}]", item


def _texts(where: str, content: Any, kinds: tuple[str, ...]) -> list[str]:
    """A message's text parts (a string content is one); other parts (images, refusals) none."""
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list):
        raise InvalidRequest(f"{where}.content must be a string or a list of content parts")
    texts = []
    for j, part in enumerate(content):
        if not isinstance(part, dict):
            raise InvalidRequest(f"{where}.content[{j}] must be an object with a `type`")
        if part.get("type") in kinds:
            text = part.get("text")
            if not isinstance(text, str):
                raise InvalidRequest(f"{where}.content[{j}].text must be a string")
            texts.append(text)
    return texts


def _object(body: dict[str, Any], name: str) -> dict[str, Any]:
    value = body.get(name)
    if not isinstance(value, dict):
        raise InvalidRequest(f"{name} must be an object (NeMo Gym's BaseVerifyRequest)")
    return value


def _item_id(index: Any) -> str:
    if index is None:
        return "rollout"
    if isinstance(index, bool) or not isinstance(index, int | str):
        raise InvalidRequest(f"{ROLLOUT_INDEX} must be an integer or a string")
    return str(index)


def _reference(body: dict[str, Any], field: str) -> str | None:
    value = body.get(field)
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    raise InvalidRequest(f"{field} (the reference, GRM_VERIFY_REFERENCE_FIELD) must be a "
                         f"string or a number, not {type(value).__name__}")


def _group(body: dict[str, Any], group_size: int | None) -> dict[str, Any]:
    """`group_id` and `group_size` of the item, or nothing: a pointwise item."""
    size = body.get("group_size", group_size)
    group = body.get("group_id")
    if group is None and size is not None and body.get(TASK_INDEX) is not None:
        group = f"gym-task-{body[TASK_INDEX]}"
    if group is None and size is None:
        return {}
    if group is None or size is None:
        raise InvalidRequest("a group needs both group_id and group_size (or, from Gym, "
                             f"{TASK_INDEX} with GRM_VERIFY_GROUP_SIZE)")
    return {"group_id": str(group) if isinstance(group, int) else group, "group_size": size}
