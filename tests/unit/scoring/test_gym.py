"""NeMo Gym's verify body read as a score item (`scoring/gym.py`), its refusals naming the field."""

from __future__ import annotations

from typing import Any

import pytest

from grm_service.errors import InvalidRequest
from grm_service.scoring.gym import item_of


def answer(*texts: str) -> dict[str, Any]:
    """A Responses API answer: a reasoning item, then one assistant message of `texts`."""
    return {"output": [
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "hm"}]},
        {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
         "content": [{"type": "output_text", "text": t, "annotations": []} for t in texts]},
        {"type": "function_call", "id": "fc_1", "call_id": "c", "name": "f", "arguments": "{}"},
    ]}


def body(**over: Any) -> dict[str, Any]:
    params = {"input": [
        {"role": "system", "content": "Think step by step."},
        {"role": "user", "content": [{"type": "input_text", "text": "2+2?"}]},
        {"role": "assistant", "content": "Hm."},
        {"role": "user", "content": "Only the number."},
    ]}
    return {"responses_create_params": params, "response": answer("4", "done"), **over}


def test_prompt_completion_reference_and_id_come_from_gyms_fields() -> None:
    item = item_of(body(expected_answer="4", _ng_task_index=3, _ng_rollout_index=2),
                   "expected_answer", None)
    assert item.prompt == "2+2?\n\nOnly the number."  # the user's turns; no system text
    assert item.completion == "4\ndone"  # the assistant's text; no reasoning, no tool call
    assert item.reference == "4"
    assert item.id == "2"
    assert item.group_id is None and item.group_size is None  # no size: pointwise


def test_a_string_input_a_numeric_reference_and_another_reference_field() -> None:
    sent = {"responses_create_params": {"input": "Say hi."}, "response": answer("hi"),
            "label": 7, "expected_answer": "ignored"}
    item = item_of(sent, "label", None)
    assert (item.prompt, item.completion, item.reference, item.id) == ("Say hi.", "hi", "7",
                                                                        "rollout")


def test_an_answer_without_text_is_judged_as_the_empty_string() -> None:
    item = item_of({**body(), "response": {"output": []}}, "expected_answer", None)
    assert item.completion == "" and item.reference is None


def test_the_group_is_the_bodys_or_gyms_task_with_the_servers_size() -> None:
    assert item_of(body(group_id="g1", group_size=4), "x", None).model_dump(
        include={"group_id", "group_size"}) == {"group_id": "g1", "group_size": 4}
    task = item_of(body(_ng_task_index=5, _ng_rollout_index=1), "x", 8)
    assert (task.group_id, task.group_size, task.id) == ("gym-task-5", 8, "1")
    own = item_of(body(_ng_task_index=5, group_id="mine"), "x", 8)
    assert (own.group_id, own.group_size) == ("mine", 8)


@pytest.mark.parametrize(("sent", "says"), [
    ({"response": answer("4")}, "responses_create_params must be an object"),
    ({"responses_create_params": {"input": "x"}, "response": []}, "response must be an object"),
    ({"responses_create_params": {"input": 3}, "response": answer("4")},
     "responses_create_params.input must be a string or a list"),
    ({"responses_create_params": {"input": ["x"]}, "response": answer("4")},
     "responses_create_params.input[0] must be an object"),
    ({"responses_create_params": {"input": [{"role": "user", "content": 1}]},
      "response": answer("4")}, "input[0].content must be a string or a list"),
    ({"responses_create_params": {"input": [{"role": "user", "content": [
        {"type": "input_text", "text": None}]}]}, "response": answer("4")},
     "input[0].content[0].text must be a string"),
    ({"responses_create_params": {"input": "x"}, "response": {"output": "4"}},
     "response.output must be a list"),
    ({**body(), "expected_answer": ["4"]}, "expected_answer (the reference, "
     "GRM_VERIFY_REFERENCE_FIELD) must be a string or a number, not list"),
    ({**body(), "_ng_rollout_index": 1.5}, "_ng_rollout_index must be an integer or a string"),
    ({**body(), "group_id": "g"}, "a group needs both group_id and group_size"),
    ({**body(), "group_id": "g", "group_size": 0}, "group_size: Input should be greater"),
])
def test_bad_bodies_are_refused_naming_the_field(sent: dict[str, Any], says: str) -> None:
    with pytest.raises(InvalidRequest, match=None) as refused:
        item_of(sent, "expected_answer", None)
    assert says in refused.value.message
