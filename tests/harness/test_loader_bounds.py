"""The loader bounds what it reads: size, depth, file kind, Unicode, integers, field names.

Each refusal is one ``FILE: $.path: reason`` line of a ``ScenarioError`` (exit 2), never a
``RecursionError``, a ``UnicodeEncodeError``, a blocked read or a message echoing megabytes.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import anyio
import pytest

from agent_session.harness import ScenarioError, load_scenario
from agent_session.harness.loader import (
    EVENT_FIELDS,
    MAX_DEPTH,
    MAX_FILE_BYTES,
    MAX_PROBLEMS,
    shorten,
)
from agent_session.harness.runner import run_scenario
from persistence import MemoryStore

LIBRARY = Path(__file__).resolve().parents[2] / "docs" / "scenarios"
#: Real seconds a refusal may take: reading a FIFO or /dev/zero must not block or run on.
GUARD_S = 10.0


def problems(path: Path) -> list[str]:
    with pytest.raises(ScenarioError) as caught:
        load_scenario(path)
    return caught.value.problems


def minimal(**extra: object) -> dict[str, object]:
    return {
        "name": "n",
        "models": [{"id": "m"}],
        "tools": [{"name": "t"}],
        "sessions": [{"id": "s1", "model": "m"}],
        "scripts": {"m": {"steps": [{"tool_calls": [{"tool": "t"}]}, {"text": "done"}]}},
        "actions": [{"at": "start", "do": {"op": "send", "session": "s1", "text": "go"}}],
        **extra,
    }


def write_json(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "s.json"
    path.write_text(json.dumps(data))
    return path


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "s.toml"
    os.mkfifo(fifo)
    assert problems(fifo) == [f"{fifo}: $: not a regular file (a FIFO)"]


def test_a_device_is_refused_without_reading_it(tmp_path: Path) -> None:
    zero = tmp_path / "zero.toml"
    zero.symlink_to("/dev/zero")
    assert problems(zero) == [f"{zero}: $: not a regular file (a character device)"]


def test_a_directory_and_a_socket_are_refused(tmp_path: Path) -> None:
    folder = tmp_path / "d.toml"
    folder.mkdir()
    assert problems(folder) == [f"{folder}: $: not a regular file (a directory)"]
    sock_path = tmp_path / "k.json"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(sock_path))
        assert problems(sock_path) == [f"{sock_path}: $: not a regular file (a socket)"]


def test_a_file_over_the_size_cap_is_refused(tmp_path: Path) -> None:
    path = write_json(tmp_path, minimal(description="x" * MAX_FILE_BYTES))
    assert problems(path) == [
        f"{path}: $: larger than {MAX_FILE_BYTES} bytes; a scenario file is small"
    ]


@pytest.mark.parametrize("suffix", [".json", ".toml"])
def test_deep_brackets_are_refused_before_the_parser_recurses(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"s{suffix}"
    sep = ": " if suffix == ".json" else " = "
    body = f'"name"{sep}' + "[" * 5000 + "]" * 5000
    path.write_text("{" + body + "}" if suffix == ".json" else body.replace('"name"', "name"))
    assert problems(path) == [f"{path}: $: line 1: nested deeper than {MAX_DEPTH} tables or arrays"]


def test_brackets_inside_strings_and_comments_are_not_nesting(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    deep = "[" * 200
    path.write_text(
        f"name = \"{deep}\"\ndescription = '''{deep}'''\n# {deep}\n[[models]]\nid = 'm'\n"
    )
    assert load_scenario(path).name == deep


def test_deep_dotted_tool_args_are_refused_naming_the_line(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    dotted = ".".join(["a"] * 3000)
    path.write_text(
        'name = "n"\n[[models]]\nid = "m"\n[[tools]]\nname = "t"\n'
        f'[[scripts.m.steps]]\n[[scripts.m.steps.tool_calls]]\ntool = "t"\nargs.{dotted} = 1\n'
    )
    assert problems(path) == [f"{path}: $: line 9: nested deeper than {MAX_DEPTH} tables or arrays"]


def test_a_document_nested_too_deep_is_refused_naming_the_path(tmp_path: Path) -> None:
    # 40 levels of header and dotted key, then 30 of inline tables: each scan bound holds
    # (the scan counts a table's brackets, not its keys), the parsed document is too deep.
    path = tmp_path / "s.toml"
    inline = "{ b = " * 30 + "1" + " }" * 30
    dotted = ".".join(["a"] * 33)
    path.write_text(
        'name = "n"\n[[models]]\nid = "m"\n[[tools]]\nname = "t"\n[[scripts.m.steps]]\n'
        f'[[scripts.m.steps.tool_calls]]\ntool = "t"\nargs.{dotted} = {inline}\n'
    )
    (line,) = problems(path)
    assert line.startswith(f"{path}: $.scripts.m.steps[0].tool_calls[0].args.a.a.")
    assert line.endswith(f": nested deeper than {MAX_DEPTH} tables or arrays")


def test_lone_surrogates_are_refused_naming_the_field(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text('{"name": "x\\ud800y", "se\\udc00": 1}')
    assert problems(path) == [  # in file order
        f"{path}: $.name: not valid Unicode: a lone surrogate in 'x\\ud800y'",
        f'{path}: $["se\\udc00"]: key is not valid Unicode (a lone surrogate)',
    ]


def test_invalid_utf8_is_refused_naming_the_byte(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_bytes(b'name = "\xff"\n')
    assert problems(path) == [f"{path}: $: not UTF-8 text: invalid start byte at byte 8"]


def test_an_integer_beyond_64_bits_is_refused(tmp_path: Path) -> None:
    path = write_json(tmp_path, minimal(engine={"max_stream_steps": 10**30}))
    (line,) = problems(path)
    assert line.startswith(f"{path}: $.engine.max_stream_steps: integer out of range")


def test_a_huge_value_is_not_echoed_in_full(tmp_path: Path) -> None:
    huge = "x" * 500_000
    path = write_json(tmp_path, minimal(engine={"max_stream_steps": huge}, **{huge: 1}))
    found = problems(path)
    assert found
    assert all(len(line) < 400 for line in found), [len(line) for line in found]
    assert any("(500000 chars)" in line for line in found)


def test_shorten_keeps_short_text_and_says_how_long_a_long_one_was() -> None:
    assert shorten("abc") == "abc"
    assert shorten("y" * 100) == "y" * 80 + "\N{HORIZONTAL ELLIPSIS} (100 chars)"


def test_a_misspelt_trigger_field_is_refused(tmp_path: Path) -> None:
    trigger = {"event": "stream-end", "sesion": "s1"}
    data = minimal()
    data["actions"] = [*data["actions"], {"at": trigger, "do": {"op": "crash"}}]  # type: ignore[misc]
    (line,) = problems(write_json(tmp_path, data))
    assert line.startswith(
        f"{tmp_path / 's.json'}: $.actions[1].at.sesion: unknown field 'sesion' of event "
        "'stream-end'; its fields are "
    )


def test_a_misspelt_expected_event_field_is_refused(tmp_path: Path) -> None:
    path = write_json(tmp_path, minimal(expect={"events": [{"event": "stop", "whyy": "x"}]}))
    assert problems(path) == [
        f"{path}: $.expect.events[0].whyy: unknown field 'whyy' of event 'stop'; its fields "
        "are seq, session, stream, t, why"
    ]


def test_event_fields_come_from_the_event_structs() -> None:
    assert EVENT_FIELDS["phase"] == {"seq", "t", "event", "session", "from", "to"}
    assert EVENT_FIELDS["crash"] == {"seq", "t", "event", "session"}
    assert {"op", "tool", "state", "acknowledged", "resolved_late"} <= EVENT_FIELDS["receipt"]
    assert EVENT_FIELDS["claim"] >= {"handle", "cut", "answer"}


def test_every_library_scenario_matches_only_real_fields() -> None:
    for path in sorted(LIBRARY.glob("*.toml")):
        load_scenario(path)  # raises on an unknown field


def test_a_restart_waiting_past_the_virtual_time_limit_exits_3(tmp_path: Path) -> None:
    # The tool acknowledges its cancel only 10^11 virtual ms later: a restart's clean
    # shutdown would wait for that; the limit ends the run instead.
    tool = {"name": "t", "duration_ms": 30_000, "ack_delay_ms": 10**11}
    data = minimal(tools=[tool], limits={"max_virtual_ms": 60_000})
    data["actions"] = [*data["actions"], {"at": {"time_ms": 1000}, "do": {"op": "restart"}}]  # type: ignore[misc]
    scenario = load_scenario(write_json(tmp_path, data))

    async def run() -> int:
        with anyio.fail_after(GUARD_S):
            result = await run_scenario(scenario, MemoryStore())
        assert result.error == "no quiescence within 60000 virtual ms (limits.max_virtual_ms)"
        return result.exit_code

    assert anyio.run(run) == 3


@pytest.mark.parametrize("suffix", [".json", ".toml"])
def test_a_byte_order_mark_is_accepted(tmp_path: Path, suffix: str) -> None:
    plain, marked = tmp_path / f"plain{suffix}", tmp_path / f"marked{suffix}"
    data = minimal(description="with a BOM")
    if suffix == ".json":
        text = json.dumps(data)
    else:
        text = (LIBRARY / "withdrawn-wake.toml").read_text(encoding="utf-8")
    plain.write_text(text, encoding="utf-8")
    marked.write_bytes(b"\xef\xbb\xbf" + text.encode())
    assert load_scenario(marked) == load_scenario(plain)


def test_a_refusal_lists_the_first_problems_and_counts_the_rest(tmp_path: Path) -> None:
    path = write_json(tmp_path, minimal(**{f"colour{i}": i for i in range(20_000)}))
    found = problems(path)
    assert found[:2] == [
        f"{path}: $.colour0: unknown key 'colour0'",
        f"{path}: $.colour1: unknown key 'colour1'",
    ]
    assert len(found) == MAX_PROBLEMS + 1
    assert found[-1] == f"{path}: $: ... and {20_000 - MAX_PROBLEMS:,} more problems"


def test_every_kind_of_problem_is_capped(tmp_path: Path) -> None:
    sessions = [{"id": f"s{i}", "model": "ghost"} for i in range(30)]  # dangling references
    path = write_json(tmp_path, minimal(sessions=sessions))
    found = problems(path)
    assert found[0] == f"{path}: $.sessions[0].model: unknown model 'ghost'"
    assert found[MAX_PROBLEMS:] == [f"{path}: $: ... and {30 - MAX_PROBLEMS} more problems"]
    path.write_text(json.dumps({"name": "n", "x": ["\\ud800"] * 25}).replace("\\\\", "\\"))
    found = problems(path)  # lone surrogates, found before the schema is checked
    assert found[0].startswith(f"{path}: $.x[0]: not valid Unicode")
    assert found[MAX_PROBLEMS:] == [f"{path}: $: ... and {25 - MAX_PROBLEMS} more problems"]


@pytest.mark.parametrize(
    ("usage", "field", "reason"),
    [
        ({"input": -1}, "input", "greater than or equal to 0"),
        ({"output": 2.5}, "output", "should be an integer, got 2.5"),
        ({"input": "900"}, "input", "should be an integer, got '900'"),
        ({"inputs": 3}, "inputs", "unknown key 'inputs'"),
    ],
)
def test_as36_a_step_usage_that_is_no_non_negative_integer_names_its_field(
    tmp_path: Path, usage: dict[str, object], field: str, reason: str
) -> None:
    data = minimal()
    data["scripts"] = {"m": {"steps": [{"text": "done", "usage": usage}]}}
    path = write_json(tmp_path, data)
    (line,) = problems(path)
    assert line.startswith(f"{path}: $.scripts.m.steps[0].usage.{field}: ")
    assert reason in line
