"""What a model is told about a tool, and the check its arguments pass before the tool runs.

A tool declares a :class:`ToolDefinition` (a description and a JSON schema of its parameters)
through an optional ``definition`` property; :func:`definition_of` reads it, and gives a tool
that declares none a definition with an open schema (any JSON object), so every tool of an
engine is offered to the model (``ModelRequest.tools``). :class:`FunctionTool` builds a tool
from a typed async function, its parameters' schema from the signature (pydantic), and
:meth:`ToolDefinition.from_model` builds a definition from a pydantic model.

Before a client call runs, its arguments are checked against the declared schema
(:class:`ArgumentsCheck`, JSON Schema through ``jsonschema``): arguments that fail become a
structured tool error the model sees (``{"error": "invalid_arguments", "problems": [...]}``),
with a ``failed`` receipt; the tool never runs and the loop goes on.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, get_type_hints

import msgspec
import pydantic
from jsonschema import Draft202012Validator, SchemaError

from persistence import ToolKind, UsageError
from stream_manager._parts import ToolCallPart, ToolResultPart

log = logging.getLogger("turnkeeper.stream")

#: The schema of a tool that declares none: any JSON object.
OPEN_PARAMETERS: Mapping[str, object] = {"type": "object"}

#: What a tool may declare as its own overlap policy (``ToolDefinition.overlap``).
OVERLAPS: frozenset[str] = frozenset({"block", "warn"})

#: How many schema problems a failed check reports to the model (the first ones, by path).
MAX_PROBLEMS = 5


class ToolDefinition(msgspec.Struct, frozen=True, kw_only=True):
    """A tool as a model sees it: its name, what it does, and its parameters' JSON schema."""

    name: str
    description: str = ""
    #: A JSON schema (an ``object`` schema) of the call's arguments.
    parameters: Mapping[str, object] = msgspec.field(default_factory=lambda: dict(OPEN_PARAMETERS))
    #: How the tool runs: a ``provider`` tool is executed by the model's provider.
    kind: ToolKind = ToolKind.CLIENT
    #: It changes nothing (MCP ``annotations.readOnlyHint``): a call may overlap an
    #: indeterminate identical one (OP-9: warned, not blocked).
    read_only: bool = False
    #: Running it twice does what running it once does (MCP ``idempotentHint``): likewise.
    idempotent: bool = False
    #: What a call meets beside an indeterminate identical one, overriding both flags and the
    #: engine-wide ``overlap_policy``: ``block`` or ``warn`` (``None``: decided as above).
    overlap: str | None = None

    @classmethod
    def from_model(
        cls,
        name: str,
        model: type[pydantic.BaseModel],
        *,
        description: str | None = None,
        kind: ToolKind = ToolKind.CLIENT,
    ) -> ToolDefinition:
        """A definition whose parameters are the fields of a pydantic model.

        The description defaults to the model's docstring.
        """
        text = description if description is not None else inspect.getdoc(model) or ""
        return cls(name=name, description=text, parameters=model.model_json_schema(), kind=kind)


def definition_of(name: str, tool: object) -> ToolDefinition:
    """``tool``'s declared definition under ``name``, or an open one (any object) if none.

    Raises:
        UsageError: The declared definition is not a :class:`ToolDefinition`, names another
            tool, or its schema is not a valid JSON schema.
    """
    declared = declared_definition(name, tool)
    if declared is None:
        return ToolDefinition(name=name, kind=ToolKind(getattr(tool, "kind", ToolKind.CLIENT)))
    return declared


def declared_definition(name: str, tool: object) -> ToolDefinition | None:
    """The definition ``tool`` declares (checked), or ``None`` when it declares none.

    Raises:
        UsageError: As :func:`definition_of`.
    """
    declared = getattr(tool, "definition", None)
    if declared is None:
        return None
    if not isinstance(declared, ToolDefinition):
        raise UsageError(
            f"tool {name!r}: definition must be a ToolDefinition, not {type(declared).__name__}"
        )
    if declared.name != name:
        raise UsageError(f"tool {name!r}: its definition is named {declared.name!r}")
    _check_overlap(name, declared.overlap)
    try:
        Draft202012Validator.check_schema(dict(declared.parameters))
    except SchemaError as error:
        problem = f"tool {name!r}: its parameters are not a JSON schema: {error.message}"
        raise UsageError(problem) from None
    kind = ToolKind(getattr(tool, "kind", ToolKind.CLIENT))
    return declared if declared.kind is kind else msgspec.structs.replace(declared, kind=kind)


def _check_overlap(name: str, overlap: str | None) -> None:
    if overlap is not None and overlap not in OVERLAPS:
        raise UsageError(f"tool {name!r}: overlap must be 'block' or 'warn', not {overlap!r}")


def overlap_of(tool: object, default: str) -> str:
    """What a call of ``tool`` meets beside an indeterminate identical call (OP-9).

    The tool's declared ``overlap`` if any; else ``warn`` for a tool declared read-only or
    idempotent; else ``default`` (the engine-wide ``overlap_policy``).
    """
    declared = getattr(tool, "definition", None)
    if not isinstance(declared, ToolDefinition):
        return default
    if declared.overlap is not None:
        return declared.overlap
    return "warn" if declared.read_only or declared.idempotent else default


def offered(tools: Mapping[str, object]) -> tuple[tuple[ToolDefinition, ...], ArgumentsCheck]:
    """What every request offers of ``tools`` (in order), and the check of declared schemas.

    Raises:
        UsageError: A tool declares a bad definition (:func:`definition_of`).
    """
    declared = {name: declared_definition(name, tool) for name, tool in tools.items()}
    definitions = tuple(
        found if found is not None else definition_of(name, tools[name])
        for name, found in declared.items()
    )
    return definitions, ArgumentsCheck(d for d in declared.values() if d is not None)


class ToolOffer:
    """What every request offers of ``tools``, kept current, and the check of their schemas.

    A tool whose definition can change while the engine runs (a supervised MCP server's tools,
    re-listed at each restart) says so with a ``definition_generation`` that moves when it
    does; at each request the offer reads those generations and, when one moved, builds the
    definitions and the arguments check again, so a changed list is offered from the next
    request on. Such a tool whose definition is ``None`` (its server no longer lists it) is left
    out. A re-listing that declares a bad definition is logged and the last offer kept.
    """

    __slots__ = ("_generations", "_live", "_tools", "arguments", "definitions")

    def __init__(self, tools: Mapping[str, object]) -> None:
        self._tools = dict(tools)
        self._live = tuple(t for t in self._tools.values() if hasattr(t, "definition_generation"))
        self.definitions, self.arguments = offered(self._tools)
        self._generations = self._read()

    def _read(self) -> tuple[object, ...]:
        return tuple(getattr(tool, "definition_generation", None) for tool in self._live)

    def current(self) -> tuple[ToolDefinition, ...]:
        """The definitions to offer now (re-built when a live tool's generation moved)."""
        if self._live:
            generations = self._read()
            if generations != self._generations:
                self._generations = generations
                self._rebuild()
        return self.definitions

    def _rebuild(self) -> None:
        listed = {
            name: tool
            for name, tool in self._tools.items()
            if not hasattr(tool, "definition_generation")
            or getattr(tool, "definition", None) is not None
        }
        try:
            self.definitions, self.arguments = offered(listed)
        except UsageError as error:
            log.warning("the tools' new definitions are not offered: %s", error)

    def problems(self, call: ToolCallPart) -> list[str]:
        """What is wrong with ``call``'s arguments against the current schemas."""
        return self.arguments.problems(call)


class ArgumentsCheck:
    """The arguments check of every tool that declares a schema (validators built once)."""

    __slots__ = ("_validators",)

    def __init__(self, declared: Iterable[ToolDefinition]) -> None:
        self._validators = {d.name: Draft202012Validator(dict(d.parameters)) for d in declared}

    def problems(self, call: ToolCallPart) -> list[str]:
        """What is wrong with ``call``'s arguments (empty: they pass, or nothing is declared)."""
        validator = self._validators.get(call.name)
        if validator is None:
            return []
        found = sorted(validator.iter_errors(dict(call.args)), key=lambda e: list(e.path))
        return [_problem(error) for error in found[:MAX_PROBLEMS]]


def _problem(error: Any) -> str:
    where = "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.path)
    return f"{where}: {error.message}"


#: What a :class:`FunctionTool`'s function returns: the call's output (any JSON value).
ToolFunction = Callable[..., Awaitable[object]]


class FunctionTool:
    """A client tool from a typed async function: its schema from the signature.

    The description is the function's docstring unless given. The model's arguments are
    checked against the schema before the call (by the engine), then validated by pydantic
    into the annotated types (a value the schema allowed but the types refuse is a failed
    result naming the field). What the function returns is the output; what it raises is a
    failed result (``tool_error``).
    """

    __slots__ = ("_adapter", "_deadline_s", "_definition", "_function", "_kind")

    def __init__(
        self,
        function: ToolFunction,
        *,
        name: str | None = None,
        description: str | None = None,
        kind: ToolKind = ToolKind.CLIENT,
        deadline_s: float | None = None,
        read_only: bool = False,
        idempotent: bool = False,
        overlap: str | None = None,
    ) -> None:
        """Build the tool; ``name`` defaults to the function's name.

        ``deadline_s`` is each call's deadline (default: the engine's ``tool_deadline_s``);
        at the deadline the call is cancelled and its receipt says so (OP-2). ``read_only``,
        ``idempotent`` and ``overlap`` go into its definition (the overlap guard, OP-9).

        Raises:
            UsageError: The function is not async, a parameter has no annotation, the
                deadline is not positive, or ``overlap`` is neither ``block`` nor ``warn``.
        """
        if not inspect.iscoroutinefunction(function):
            raise UsageError(f"FunctionTool needs an async function, not {function!r}")
        if deadline_s is not None and not deadline_s > 0:
            raise UsageError(f"deadline_s must be positive, not {deadline_s!r}")
        _check_overlap(name or function.__name__, overlap)
        self._function = function
        self._kind = kind
        self._deadline_s = deadline_s
        tool_name = name or function.__name__
        fields: dict[str, Any] = {}
        hints = get_type_hints(function)
        for parameter in inspect.signature(function).parameters.values():
            if parameter.name not in hints:
                raise UsageError(f"tool {tool_name!r}: parameter {parameter.name!r} has no type")
            default = ... if parameter.default is inspect.Parameter.empty else parameter.default
            fields[parameter.name] = (hints[parameter.name], default)
        model = pydantic.create_model(f"{tool_name}_arguments", **fields)
        self._adapter: type[pydantic.BaseModel] = model
        text = description if description is not None else inspect.getdoc(function) or ""
        self._definition = ToolDefinition(
            name=tool_name,
            description=text,
            parameters=model.model_json_schema(),
            kind=kind,
            read_only=read_only,
            idempotent=idempotent,
            overlap=overlap,
        )

    @property
    def name(self) -> str:
        """The name the model calls it by."""
        return self._definition.name

    @property
    def kind(self) -> ToolKind:
        """How it runs."""
        return self._kind

    @property
    def definition(self) -> ToolDefinition:
        """Its description and parameters' schema."""
        return self._definition

    def deadline_for(self, call: ToolCallPart) -> float | None:
        """Each call's deadline in seconds (``None``: the engine's default)."""
        return self._deadline_s

    async def execute(self, call: ToolCallPart, context: object) -> ToolResultPart:
        """Validate the arguments into the function's types, call it, return its output."""
        try:
            arguments = self._adapter.model_validate(dict(call.args))
        except pydantic.ValidationError as error:
            problems = [
                f"$.{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in error.errors()
            ]
            return ToolResultPart(
                call_id=call.call_id,
                name=call.name,
                output={"error": "invalid_arguments", "problems": problems[:MAX_PROBLEMS]},
                is_error=True,
            )
        values = {field: getattr(arguments, field) for field in type(arguments).model_fields}
        output = await self._function(**values)
        return ToolResultPart(call_id=call.call_id, name=call.name, output=output)
