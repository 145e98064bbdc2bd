"""Loading a scenario file: the validated boundary of the scripted fake-model harness.

:func:`load_scenario` reads TOML or JSON (by suffix), validates the structure with the models of
:mod:`agent_session.harness.scenario`, then checks the references between parts of the file.
Every problem is reported at once, as one ``FILE: $.path.to.field: reason`` line each, in a
:class:`ScenarioError` (a :class:`~persistence.UsageError`: the CLI's exit 2). Checks run in two
rounds: references are only checked once the structure is valid, because there is nothing sound
to check them against before that.

Pydantic's error locations are rewritten into file paths: list positions become ``[i]``, keys
become ``.key`` (or ``["odd key"]``), the tags of the two unions (a trigger's variant, an action's
``op``) are dropped so the path points into the table the file holds, and an event trigger's
gathered ``match`` fields are shown where the file put them, beside ``event``.

:func:`script_steps` converts one model's script into the ``stream_manager`` Structs the
:class:`~stream_manager.ScriptedModel` plays; nothing deeper than the harness sees pydantic.
"""

from __future__ import annotations

import copy
import itertools
import json
import os
import re
import stat
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final, get_args

import msgspec
from pydantic import ValidationError

from agent_session._events import EngineEvent
from agent_session.harness import prescan
from agent_session.harness.scenario import (
    Action,
    DelegateAction,
    EnqueueAction,
    EventTrigger,
    Expect,
    GoalAction,
    HandleAction,
    Scenario,
    SendAction,
    ToolCallSpec,
    ToolSpec,
    Trigger,
    WithdrawAction,
)
from agent_session.harness.trace import Crash
from persistence import UsageError
from stream_manager import ScriptStep, ScriptToolCall, Usage, redact

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Mapping, Sequence

    from pydantic_core import ErrorDetails

#: The fields every trace line has (``docs/trace.md``), whatever its event.
LINE_FIELDS: Final = frozenset({"seq", "t", "event", "session"})
#: The names ``docs/trace.md`` reserves for features not built: valid, but no Struct emits
#: them yet, so their fields are the page's.
_UNBUILT_EVENTS: Final = {
    "claim": ("handle", "cut", "answer"),
    "settled": ("handle", "status"),
}


def _event_fields() -> dict[str, frozenset[str]]:
    """Each trace event's name and the fields of its lines, read off the event Structs."""
    structs: list[type[msgspec.Struct]] = [*get_args(EngineEvent), Crash]
    fields = {
        str(struct.__struct_config__.tag): LINE_FIELDS
        | {field.encode_name for field in msgspec.structs.fields(struct)}
        for struct in structs
    }
    for name, extra in _UNBUILT_EVENTS.items():
        fields.setdefault(name, LINE_FIELDS | set(extra))
    return fields


#: Every trace event name of ``docs/trace.md`` and the fields a line of it has.
EVENT_FIELDS: Final = _event_fields()
#: Every trace event name of ``docs/trace.md``, the harness's ``crash`` included.
TRACE_EVENTS: Final = frozenset(EVENT_FIELDS)
#: The most a scenario file may hold (bytes): it is read no further.
MAX_FILE_BYTES: Final = 1 << 20
#: The deepest nesting of tables and arrays a scenario file may hold.
MAX_DEPTH: Final = 64
#: The integers a scenario file may hold (TOML's own range: 64-bit signed).
_INT_RANGE: Final = (-(1 << 63), (1 << 63) - 1)
_SURROGATE: Final = re.compile("[\ud800-\udfff]")
#: How many problems a refusal lists; the rest are counted (``... and N more problems``).
MAX_PROBLEMS: Final = 20

Loc = tuple[str | int, ...]
Problem = tuple[Loc, str]

_SIMPLE_KEY: Final = re.compile(r"[A-Za-z0-9_-]+")
_WORDING: Final = (
    (re.compile(r"^Input should be"), "should be"),
    (
        re.compile(r"a valid dictionary( or (instance of \w+|object to extract fields from))?"),
        "a table",
    ),
    (re.compile(r"a valid list"), "an array"),
    (re.compile(r"a valid (string|boolean|number)"), r"a \1"),
    (re.compile(r"a valid integer"), "an integer"),
)
#: Trace-event fields whose values name something the file declares.
_NAMED_FIELDS: Final = ("session", "tool", "model", "handle")


#: How much of a value an error message echoes (``shorten``).
ECHO_LIMIT: Final = 80


def shorten(text: str, limit: int = ECHO_LIMIT) -> str:
    """``text`` as an error message echoes it: redacted, then whole or its start and length.

    Redacted before it is cut: a credential cut short no longer has its shape, and its first
    part would be shown.

    Args:
        text: The value to echo.
        limit: How many characters are shown of a longer one.

    Returns:
        ``text`` redacted when it is short enough, else its first ``limit`` characters and its
        length.
    """
    text = redact(text)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text)} chars)"


class ScenarioError(UsageError):
    """A scenario file is invalid.

    Attributes:
        problems: One ``FILE: $.path.to.field: reason`` line per problem, in file order where
            the validator knows it; ``str()`` of the error is these lines joined by newlines.
    """

    def __init__(self, problems: Iterable[str]) -> None:
        self.problems = list(dict.fromkeys(problems))
        super().__init__("\n".join(self.problems))


def load_scenario(path: str | Path, *, supported_ops: frozenset[str] | None = None) -> Scenario:
    """Read, validate and reference-check one scenario file.

    Args:
        path: A ``.toml`` or ``.json`` file; problems name it exactly as given.
        supported_ops: When given, an action whose op is not in it is a problem (for a runtime
            that does not implement every op yet).

    Returns:
        The validated scenario.

    Raises:
        ScenarioError: The file cannot be read or parsed, or is invalid; every problem found
            is listed.
    """
    shown = str(path)
    data = _read(Path(path), shown)
    try:
        scenario = Scenario.model_validate(data)
    except ValidationError as exc:
        problems = (_from_pydantic(error, data) for error in _pydantic_errors(exc))
        raise ScenarioError(_lines(shown, problems, exc.error_count())) from None
    found = list(reference_problems(scenario, supported_ops=supported_ops))
    if found:
        raise ScenarioError(_lines(shown, found))
    return scenario


def reference_problems(
    scenario: Scenario, *, supported_ops: frozenset[str] | None = None
) -> Iterator[Problem]:
    """Every dangling reference in a structurally valid scenario.

    Args:
        scenario: The scenario to check.
        supported_ops: When given, the action ops a runtime implements.

    Yields:
        ``(location, reason)`` per problem; :func:`format_path` renders the location.
    """
    names = _Names.of(scenario)
    yield from _check_declarations(scenario)
    yield from _check_models(scenario, names)
    for index, spec in enumerate(scenario.actions):
        yield from _check_trigger(("actions", index, "at"), spec.at, names)
        yield from _check_action(("actions", index, "do"), spec.do, names, supported_ops)
    if scenario.expect is not None:
        yield from _check_expect(scenario.expect, names)


def format_path(loc: Loc) -> str:
    """Render a location as a file path: ``("actions", 2, "do")`` is ``$.actions[2].do``.

    Args:
        loc: Keys and list positions from the top of the file.

    Returns:
        The path, ``$`` for the whole file.
    """
    parts = ["$"]
    for part in loc:
        if isinstance(part, int):
            parts.append(f"[{part}]")
        elif _SIMPLE_KEY.fullmatch(part):
            parts.append(f".{part}")
        else:
            parts.append(f"[{json.dumps(part)}]")
    return "".join(parts)


def script_steps(scenario: Scenario, model_id: str) -> list[ScriptStep]:
    """Convert a model's scripted steps into the Structs a ``ScriptedModel`` plays.

    Calls to a ``provider`` tool are marked provider-executed and carry the result (the call's
    own override, else the tool's); every call carries the behaviour overrides it gave, and
    only those. A declared model with no script gets no steps (its first step is an error).

    Args:
        scenario: A loaded scenario.
        model_id: A model the scenario declares.

    Returns:
        The steps, in order.

    Raises:
        UsageError: The scenario declares no such model.
    """
    if model_id not in {model.id for model in scenario.models}:
        raise UsageError(
            f"scenario {shorten(scenario.name)!r} declares no model {shorten(model_id)!r}"
        )
    script = scenario.scripts.get(model_id)
    if script is None:
        return []
    tools = {tool.name: tool for tool in scenario.tools}
    return [
        ScriptStep(
            text=step.text,
            reasoning=step.reasoning,
            tool_calls=tuple(_script_call(call, tools.get(call.tool)) for call in step.tool_calls),
            refuse=step.refuse,
            error=step.error,
            delay_ms=step.delay_ms,
            usage=None
            if step.usage is None
            else Usage(input_tokens=step.usage.input, output_tokens=step.usage.output),
        )
        for step in script.steps
    ]


def _script_call(call: ToolCallSpec, tool: ToolSpec | None) -> ScriptToolCall:
    provider = tool is not None and tool.kind == "provider"
    result: object = None
    if tool is not None and provider:
        result = call.result if "result" in call.model_fields_set else tool.result
    return ScriptToolCall(
        tool=call.tool,
        args=copy.deepcopy(call.args),
        provider_executed=provider,
        result=copy.deepcopy(result),
        behaviour=copy.deepcopy(call.behaviour()),
    )


# --- reading and pydantic's errors -----------------------------------------------------------


def _read(path: Path, shown: str) -> object:
    suffix = path.suffix.lower()
    if suffix not in (".toml", ".json"):
        raise ScenarioError(
            [f"{shown}: $: unsupported file type {shorten(suffix)!r}; use .toml or .json"]
        )
    raw = _read_bounded(path, shown)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        where = f"byte {exc.start}"
        raise ScenarioError([f"{shown}: $: not UTF-8 text: {exc.reason} at {where}"]) from None
    text = text.removeprefix("\ufeff")  # a byte order mark is not part of the document
    try:
        (prescan.check_toml if suffix == ".toml" else prescan.check_json)(text, MAX_DEPTH)
    except prescan.TooDeep as deep:
        reason = f"{deep.where}nested deeper than {MAX_DEPTH} tables or arrays"
        raise ScenarioError([f"{shown}: $: {reason}"]) from None
    try:
        data = tomllib.loads(text) if suffix == ".toml" else json.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError([f"{shown}: $: invalid TOML: {shorten(str(exc), 200)}"]) from None
    except json.JSONDecodeError as exc:
        raise ScenarioError([f"{shown}: $: invalid JSON: {shorten(str(exc), 200)}"]) from None
    except (RecursionError, ValueError) as exc:  # a parser's own limits, never a traceback
        raise ScenarioError([f"{shown}: $: cannot parse: {shorten(str(exc), 200)}"]) from None
    found = list(_value_problems(data))
    if found:
        raise ScenarioError(_lines(shown, found))
    return data


def _read_bounded(path: Path, shown: str) -> bytes:
    """The file's bytes: a regular file of at most ``MAX_FILE_BYTES``, read no further.

    A FIFO, a device, a socket or a directory is refused from its ``stat``, before any open
    that could block (a FIFO with no writer) or read forever (``/dev/zero``); the open itself
    never blocks (``O_NONBLOCK``) and what it opened is checked again.
    """

    def refuse(reason: str) -> ScenarioError:
        return ScenarioError([f"{shown}: $: {reason}"])

    try:
        kind = _file_kind(os.stat(path).st_mode)
        if kind is not None:
            raise refuse(f"not a regular file ({kind})")
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except OSError as exc:
        raise refuse(f"cannot read the file: {exc.strerror or exc}") from None
    try:
        kind = _file_kind(os.fstat(fd).st_mode)
        if kind is not None:
            raise refuse(f"not a regular file ({kind})")
        chunks: list[bytes] = []
        size = 0
        while size <= MAX_FILE_BYTES:
            chunk = os.read(fd, MAX_FILE_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise refuse(f"cannot read the file: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if size > MAX_FILE_BYTES:
        raise refuse(f"larger than {MAX_FILE_BYTES} bytes; a scenario file is small")
    return b"".join(chunks)


def _file_kind(mode: int) -> str | None:
    """What a non-regular file is (``None`` for a regular file)."""
    if stat.S_ISREG(mode):
        return None
    kinds = (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    )
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def _value_problems(data: object) -> Iterator[Problem]:
    """What the parsed document holds that no scenario may: walked without recursion.

    Nesting deeper than ``MAX_DEPTH`` (a last check: the raw text's scan refuses it first), a
    key or string with a lone surrogate (a JSON escape of half a pair: not Unicode text), an
    integer outside 64 bits. The walk holds one iterator per level, never a table's or an
    array's every child at once, so its memory is bounded by the depth, not the size.
    """
    yield from _leaf_problems((), data)
    levels: list[tuple[Loc, Iterator[tuple[str | int, object]]]] = []
    if isinstance(data, dict | list):
        levels.append(((), _children(data)))
    while levels:
        loc, children = levels[-1]
        child = next(children, None)
        if child is None:
            levels.pop()
            continue
        key, value = child
        here = (*loc, key)
        if isinstance(key, str) and _SURROGATE.search(key):
            yield here, "key is not valid Unicode (a lone surrogate)"
        elif len(here) > MAX_DEPTH:
            yield here[:MAX_DEPTH], f"nested deeper than {MAX_DEPTH} tables or arrays"
        elif isinstance(value, dict | list):
            levels.append((here, _children(value)))
        else:
            yield from _leaf_problems(here, value)


def _children(value: dict[str, object] | list[object]) -> Iterator[tuple[str | int, object]]:
    return iter(value.items()) if isinstance(value, dict) else enumerate(value)


def _leaf_problems(loc: Loc, value: object) -> Iterator[Problem]:
    if isinstance(value, str) and _SURROGATE.search(value):
        yield loc, f"not valid Unicode: a lone surrogate in {_describe(value)}"
    elif isinstance(value, int) and not isinstance(value, bool):
        low, high = _INT_RANGE
        if not low <= value <= high:
            yield loc, f"integer out of range ({low} to {high})"


def _lines(shown: str, problems: Iterable[Problem], total: int | None = None) -> list[str]:
    """The first ``MAX_PROBLEMS`` problems as lines, then how many more there are.

    Args:
        shown: The file as the lines name it.
        problems: The problems, in order; read no further than needed when ``total`` is given.
        total: How many problems there are in all, when it is known without reading them.
    """
    found = iter(problems)
    first = list(itertools.islice(found, MAX_PROBLEMS))
    lines = [f"{shown}: {format_path(_short_loc(loc))}: {reason}" for loc, reason in first]
    rest = sum(1 for _ in found) if total is None else total - len(first)
    if rest > 0:
        lines.append(f"{shown}: $: ... and {rest:,} more problems")
    return lines


def _short_loc(loc: Loc) -> Loc:
    return tuple(shorten(part) if isinstance(part, str) else part for part in loc)


def _pydantic_errors(exc: ValidationError) -> Iterator[ErrorDetails]:
    """The validation errors, in order, decoded one at a time as they are read.

    ``exc.errors()`` builds every error as Python objects at once (half a million of them,
    from a 1 MiB file of ``[1,1,...]`` actions, take seconds and half a gigabyte); their JSON
    text is a single string, decoded here no further than the refusal reads. Their inputs
    are left out (the input is found in the document, :func:`_input_at`).
    """
    text = exc.json(include_url=False, include_input=False)
    decoder = json.JSONDecoder()
    at = 1  # past the array's "["
    while text[at] not in "]":
        error, at = decoder.raw_decode(text, at)
        yield error
        at += text[at] == ","


def _input_at(data: object, loc: Loc) -> object:
    """The value at ``loc`` (a path in the file) in the document.

    A part of the path that is not a key or a position there (an unnamed union's member) is
    passed over.
    """
    value = data
    for part in loc:
        in_table = isinstance(value, dict) and part in value
        in_array = isinstance(value, list) and isinstance(part, int) and 0 <= part < len(value)
        if in_table or in_array:
            value = value[part]  # type: ignore[index]
    return value


def _from_pydantic(error: ErrorDetails, data: object) -> Problem:
    kind, loc = error["type"], tuple(error["loc"])
    is_key = "[key]" in loc
    loc = tuple(part for part in loc if part != "[key]")
    if len(loc) > 3 and loc[0] == "actions" and loc[2] in ("at", "do"):
        loc = loc[:3] + loc[4:]  # the union's tag: the trigger variant, or the action's op
        if loc[2] == "at" and len(loc) > 4 and loc[3] == "match":
            loc = loc[:3] + loc[4:]  # gathered match fields sit beside `event` in the file
    last = shorten(loc[-1]) if loc and isinstance(loc[-1], str) else loc[-1] if loc else ""
    if kind == "extra_forbidden":
        return loc, f"unknown key {last!r}"
    if kind == "missing":
        return loc, f"missing required key {last!r}"
    if kind == "union_tag_not_found":
        return (*loc, "op"), "missing required key 'op'"
    if kind == "union_tag_invalid":
        ctx = error.get("ctx", {})
        tag, expected = ctx.get("tag"), ctx.get("expected_tags")
        return (*loc, "op"), f"unknown op {_describe(tag)}; expected one of {expected}"
    reason = shorten(error["msg"].removeprefix("Value error, "), 300)
    for pattern, replacement in _WORDING:
        reason = pattern.sub(replacement, reason)
    if reason.startswith("should be"):
        got = _describe(loc[-1] if is_key else _input_at(data, loc))
        reason = f"{'key ' if is_key else ''}{reason}, got {got}"
    return loc, reason[:1].lower() + reason[1:]


def _describe(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        value = redact(value)  # before the cut: see shorten
        return repr(value if len(value) <= 40 else value[:37] + "...")
    return shorten(str(value))


# --- references ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Names:
    """What the file declares, for reference checks."""

    models: frozenset[str]
    tools: frozenset[str]
    sessions: frozenset[str]
    entries: frozenset[tuple[str, str]]  # (session, entry) declared by send/enqueue
    cancelable: frozenset[tuple[str, str]]  # ... by enqueue: only those have a cancel signal
    handles: frozenset[str]  # declared by delegate
    goals: frozenset[str]  # sessions that declare a goal

    @classmethod
    def of(cls, scenario: Scenario) -> _Names:
        actions = [spec.do for spec in scenario.actions]
        return cls(
            models=frozenset(model.id for model in scenario.models),
            tools=frozenset(tool.name for tool in scenario.tools),
            sessions=frozenset(session.id for session in scenario.sessions),
            entries=frozenset(
                (a.session, a.entry)
                for a in actions
                if isinstance(a, SendAction | EnqueueAction) and a.entry is not None
            ),
            cancelable=frozenset(
                (a.session, a.entry)
                for a in actions
                if isinstance(a, EnqueueAction) and a.entry is not None
            ),
            handles=frozenset(a.handle for a in actions if isinstance(a, DelegateAction)),
            goals=frozenset(s.id for s in scenario.sessions if s.goal is not None),
        )

    def named(self, field: str) -> frozenset[str]:
        return {"session": self.sessions, "tool": self.tools, "model": self.models}.get(
            field, self.handles
        )


def _check_declarations(scenario: Scenario) -> Iterator[Problem]:
    declared = (
        ("models", "id", [model.id for model in scenario.models]),
        ("tools", "name", [tool.name for tool in scenario.tools]),
        ("sessions", "id", [session.id for session in scenario.sessions]),
    )
    for field, key, idents in declared:
        for index, ident in enumerate(idents):
            if ident in idents[:index]:
                yield (field, index, key), f"duplicate {field[:-1]} {key} {shorten(ident)!r}"


def _check_models(scenario: Scenario, names: _Names) -> Iterator[Problem]:
    for index, model in enumerate(scenario.models):
        for position, fallback in enumerate(model.fallbacks):
            if fallback not in names.models:
                yield (
                    ("models", index, "fallbacks", position),
                    f"unknown model {shorten(fallback)!r}",
                )
    for index, session in enumerate(scenario.sessions):
        if session.model not in names.models:
            yield ("sessions", index, "model"), f"unknown model {shorten(session.model)!r}"
    for model_id, script in scenario.scripts.items():
        if model_id not in names.models:
            yield ("scripts", model_id), f"script for undeclared model {shorten(model_id)!r}"
        for step_index, step in enumerate(script.steps):
            for call_index, call in enumerate(step.tool_calls):
                if call.tool not in names.tools:
                    loc = ("scripts", model_id, "steps", step_index, "tool_calls", call_index)
                    yield (*loc, "tool"), f"unknown tool {shorten(call.tool)!r}"


def _check_fields(
    loc: Loc, event: str, fields: Mapping[str, object], names: _Names
) -> Iterator[Problem]:
    known = EVENT_FIELDS.get(event)
    if known is not None:
        for field in fields:
            if field not in known:
                yield (
                    (*loc, field),
                    f"unknown field {shorten(field)!r} of event {event!r}; its fields are "
                    + ", ".join(sorted(known - {"event"})),
                )
    for field in _NAMED_FIELDS:
        value = fields.get(field)
        if isinstance(value, str) and value not in names.named(field):
            yield (*loc, field), f"unknown {field} {shorten(value)!r}"


def _check_trigger(loc: Loc, trigger: Trigger, names: _Names) -> Iterator[Problem]:
    if not isinstance(trigger, EventTrigger):
        return
    if trigger.event not in TRACE_EVENTS:
        yield (*loc, "event"), f"unknown event {shorten(trigger.event)!r}"
    yield from _check_fields(loc, trigger.event, trigger.match, names)


def _check_action(
    loc: Loc, action: Action, names: _Names, supported_ops: frozenset[str] | None
) -> Iterator[Problem]:
    if supported_ops is not None and action.op not in supported_ops:
        yield (*loc, "op"), f"op {action.op!r} is not supported yet"
    for field in ("session", "owner", "target"):
        value = getattr(action, field, None)
        if isinstance(value, str) and value not in names.sessions:
            yield (*loc, field), f"unknown session {shorten(value)!r}"
    if isinstance(action, WithdrawAction):
        yield from _check_withdraw(action, loc, names)
    if (
        isinstance(action, GoalAction)
        and action.session in names.sessions
        and action.session not in names.goals
    ):
        yield (*loc, "session"), f"{shorten(action.session)!r} declares no goal to move"
    handle = action.handle if isinstance(action, HandleAction | EnqueueAction) else None
    if handle is not None and handle not in names.handles:
        yield (
            (*loc, "handle"),
            f"unknown handle {shorten(handle)!r}; no delegate action declares it",
        )


def _check_withdraw(action: WithdrawAction, loc: Loc, names: _Names) -> Iterator[Problem]:
    key = (action.session, action.entry)
    if key not in names.entries:
        yield (
            (*loc, "entry"),
            f"unknown entry {shorten(action.entry)!r}; no send or enqueue action on session "
            f"{shorten(action.session)!r} declares it",
        )
    elif key not in names.cancelable:
        yield (
            (*loc, "entry"),
            f"entry {shorten(action.entry)!r} is a user message (send): it has no cancel signal to "
            "fire; only enqueued entries can be withdrawn",
        )


def _check_expect(expect: Expect, names: _Names) -> Iterator[Problem]:
    by_session: Sequence[tuple[str, Mapping[str, object]]] = (
        ("phases", expect.phases),
        ("owed", expect.owed),
        ("streams", expect.streams),
        ("unanswered", expect.unanswered),
    )
    for field, values in by_session:
        for key in values:
            if key not in names.sessions:
                yield ("expect", field, key), f"unknown session {shorten(key)!r}"
    for key in expect.handles:
        if key not in names.handles:
            yield ("expect", "handles", key), f"unknown handle {shorten(key)!r}"
    for index, item in enumerate(expect.events):
        event = item["event"]
        if event not in TRACE_EVENTS:
            yield ("expect", "events", index, "event"), f"unknown event {shorten(str(event))!r}"
        if isinstance(event, str):
            yield from _check_fields(("expect", "events", index), event, item, names)
