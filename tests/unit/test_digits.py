"""Every parser of an integer that comes from outside the service, held to ASCII digits: a text
that `str.isdigit` accepts and `int` refuses ('²') was a 500 with a traceback, and one `int`
accepts in a form nobody documents ('٣' is 3, ' 1', '1_000') was read as a number."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import typer

from grm_service.commands.ledger import selection
from grm_service.config import Settings
from grm_service.digits import INT64_MAX, decimal, is_decimal
from grm_service.engine_side.identity import numerics
from grm_service.errors import BadTag
from grm_service.gateway.edge.head import RequestHead
from grm_service.gpus import Gpu, visible_devices
from grm_service.host import remove_dead_owners
from grm_service.ledger.query import parse_steps
from grm_service.ledger.records import parse_step

# What `str.isdigit` takes and `int` refuses or reads otherwise, and the forms around a number.
BAD = ["²", "٣", "\uff11", "-1", " 1", "1 ", "+1", "1_000", "1e3", "1.0", "0x1"]
GPUS = (Gpu(0, "A", "GPU-a"), Gpu(1, "B", "GPU-b"), Gpu(3, "C", "GPU-c"))


def test_the_texts_are_what_broke_the_old_check() -> None:
    assert "²".isdigit() and "٣".isdigit() and int("٣") == 3
    with pytest.raises(ValueError):
        int("²")


@pytest.mark.parametrize("text", [*BAD, ""])
def test_decimal_takes_ascii_digits_alone(text: str) -> None:
    assert decimal(text) is None and not is_decimal(text)


def test_decimal_reads_ascii_digits_up_to_its_bound() -> None:
    assert decimal("0") == 0 and decimal("007") == 7 and decimal("12", most=12) == 12
    assert decimal(str(INT64_MAX)) == INT64_MAX and decimal(str(INT64_MAX + 1)) is None
    assert decimal("13", most=12) is None
    assert decimal("9" * 5000) is None  # int() refuses texts of over 4300 digits
    assert decimal("0" * 5000 + "1") == 1


def _refused(parse: Callable[[str], Any], text: str, error: type[Exception]) -> None:
    with pytest.raises(error) as caught:
        parse(text)
    assert "ASCII digits" in str(caught.value)


@pytest.mark.parametrize("text", BAD)
def test_the_step_header_is_a_400_naming_it(text: str) -> None:
    with pytest.raises(BadTag, match="x-grm-step must be an integer from 0 to") as caught:
        parse_step(text)
    assert caught.value.http_status == 400 and repr(text) in caught.value.message
    assert parse_step("") is None and parse_step("12") == 12


@pytest.mark.parametrize("text", BAD)
@pytest.mark.parametrize("form", ["{}", "{}:", ":{}", "1:{}", "{}:9"])
def test_steps_of_the_api_and_the_cli_name_the_form(form: str, text: str) -> None:
    steps = form.format(text)
    _refused(parse_steps, steps, ValueError)
    with pytest.raises(typer.BadParameter, match="ASCII digits"):
        selection(None, steps)
    assert parse_steps("") == (None, None) and parse_steps("3:12") == (3, 12)


@pytest.mark.parametrize("text", [*BAD, ""])
def test_engine_args_outside_ascii_digits_are_not_numbers(text: str) -> None:
    settings = Settings(model="m", engine_args=["--tensor-parallel-size", text])
    assert settings.tensor_parallel_size == 1
    assert numerics(["serve", "m", "-tp", text])["tensor_parallel_size"] == 1
    assert numerics(["serve", "m", "--max-model-len", text])["max_model_len"] == text
    read = numerics(["serve", "m", "--max-model-len", "512", "-tp", "2"])
    assert (read["max_model_len"], read["tensor_parallel_size"]) == (512, 2)


# The mask's entries are stripped of spaces first (`visible_devices`), as CUDA reads them.
@pytest.mark.parametrize("text", [t for t in [*BAD, ""] if t.strip() == t])
def test_a_cuda_mask_entry_outside_ascii_digits_stops_the_list_as_cuda_does(text: str) -> None:
    assert visible_devices(GPUS, f"1,{text},0") == ["B"]
    assert visible_devices(GPUS, "3,0") == ["C", "A"]


@pytest.mark.parametrize("text", [t for t in BAD if "/" not in t])
def test_a_work_folder_whose_pid_is_not_ascii_digits_is_left_alone(text: str,
                                                                  tmp_path: Path) -> None:
    (tmp_path / f"run-{text}-x").mkdir()
    assert remove_dead_owners(tmp_path, "run-") == []
    assert (tmp_path / f"run-{text}-x").is_dir()


@pytest.mark.parametrize("text", [t for t in BAD if t.isascii() or t == "²"])
def test_a_content_length_outside_ascii_digits_is_no_length(text: str) -> None:
    header = text.encode("latin-1")
    assert RequestHead([(b"content-length", header)]).content_length == -1
    assert RequestHead([(b"content-length", b"12")]).content_length == 12
