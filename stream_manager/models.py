"""Real models: any pydantic-ai model as a turnkeeper :class:`~stream_manager.ports.Model`.

Install the ``models`` extra (``pip install 'turnkeeper[models]'``: ``pydantic-ai-slim`` with
its OpenAI client; add pydantic-ai-slim's other provider extras for other providers). Then::

    model = PydanticAIModel("openai:gpt-4.1-mini")                    # a pydantic-ai model name
    model = PydanticAIModel("qwen3", base_url="http://127.0.0.1:8000/v1")  # OpenAI-compatible
    model = PydanticAIModel(FunctionModel(stream_function=...))        # any pydantic-ai Model

A name is resolved when the adapter is built, so an unknown name, a missing provider extra or
a missing API key is one :class:`ModelUnavailable` line before the engine starts, never a
failure on the first turn.

One ``stream_step`` is one pydantic-ai streamed request (``pydantic_ai.direct``): the request's
history becomes pydantic-ai messages (tool calls and results, provider-executed ones as native
tool parts), its tool definitions become function tools (``provider`` tools become the native
tool of that kind, e.g. ``web_search``), and its thinking level the ``thinking`` setting.
Each part is yielded as soon as pydantic-ai ends it (a block's end is where a soft stop may
land): text, thinking (a ``ReasoningPart``), tool calls, and provider-executed calls and their
results. The step's ``Finish`` carries the provider's usage (a ``usage`` event).
``on_text_delta`` sees the text as it streams, for a live display.

Failures map to typed :class:`~stream_manager.errors.ModelError` types (``docs/models.md``
has the table): rate limits, overloads, 5xx and lost connections are retryable;
authentication, quota, an unknown model and other rejected requests are terminal; a context
window error is ``context_exceeded``; a content-filter finish or refusal is a ``refusal`` finish,
which the fallback chain takes over (SM-16); a malformed provider response (tool arguments that
are no JSON object, for one) is ``malformed_output``. SDK-level retries are off for the
clients the adapter builds: retrying is the engine's decision.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, Any

from persistence import UsageError
from stream_manager._parts import (
    ChatMessage,
    Finish,
    FinishReason,
    Part,
    ReasoningPart,
    Role,
    TextPart,
    ToolCallPart,
    ToolResultPart,
    Usage,
)
from stream_manager.errors import ErrorType, ModelError
from stream_manager.ports import ModelRequest, ToolKind
from stream_manager.redaction import cover_library_logs
from stream_manager.tools import ToolDefinition

if TYPE_CHECKING:
    from pydantic_ai import messages as pai_messages
    from pydantic_ai.models import Model as PaiModel
    from pydantic_ai.models import ModelRequestParameters
    from pydantic_ai.settings import ModelSettings

#: What the ``models`` extra's absence says.
INSTALL_HINT = "pip install 'turnkeeper[models]'"
#: The roots of the model clients' loggers: their DEBUG records quote each request whole (the
#: prompt, the tool results), so they stay at WARNING unless the host set a level, redacted.
CLIENT_LOGGERS = ("openai", "httpx", "httpcore", "httpx2", "httpcore2", "pydantic_ai")
#: Thinking levels pydantic-ai's ``thinking`` setting takes as they are.
THINKING_LEVELS = frozenset({"minimal", "low", "medium", "high", "xhigh", "max"})
_THINKING_OFF = frozenset({"off", "none", "false"})
_FINISH = {
    "stop": FinishReason.STOP,
    "length": FinishReason.LENGTH,
    "tool_call": FinishReason.TOOL_CALLS,
    "content_filter": FinishReason.REFUSAL,
}


class ModelUnavailable(UsageError):
    """A model could not be built: unknown name, missing provider extra or missing API key."""


class PydanticAIModel:
    """A pydantic-ai model as a turnkeeper model (one streamed request per step)."""

    __slots__ = ("_client", "_id", "_model", "_on_text_delta", "_settings")

    def __init__(
        self,
        model: str | PaiModel,
        *,
        model_id: str | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        settings: ModelSettings | None = None,
        on_text_delta: Callable[[str], None] | None = None,
    ) -> None:
        """Build the adapter; a name is resolved here.

        Args:
            model: A pydantic-ai model name (``"openai:gpt-4.1"``, ``"anthropic:..."``), a model
                name served by ``base_url``, or a pydantic-ai ``Model`` instance.
            model_id: The id chains and requests use (default: the name, or the instance's
                ``model_name``).
            base_url: An OpenAI-compatible chat-completions server (``.../v1``); ``model``
                is then the name that server knows.
            api_key: The key for ``base_url`` (default ``OPENAI_API_KEY``; a local server
                that needs none gets a placeholder).
            settings: pydantic-ai model settings for every request (temperature, max_tokens).
            on_text_delta: Called with each text delta as it streams (a live display).

        Raises:
            ModelUnavailable: The extra is not installed, the name is unknown, a provider
                extra or a key is missing.
        """
        self._client: Any = None
        if base_url is None:
            self._model = _resolve(model, api_key)
        elif isinstance(model, str) and model:
            self._model, self._client = _compatible(model, base_url, api_key)
        else:
            raise ModelUnavailable(
                f"base_url goes with a model name the server knows, not {model!r}"
            )
        cover_library_logs(CLIENT_LOGGERS)  # their loggers exist once the client is built
        self._id = model_id or (model if isinstance(model, str) else self._model.model_name)
        self._settings = settings
        self._on_text_delta = on_text_delta

    @property
    def id(self) -> str:
        """The model's id, as chains and requests name it."""
        return self._id

    @property
    def model(self) -> PaiModel:
        """The pydantic-ai model requests go to."""
        return self._model

    async def aclose(self) -> None:
        """Close the HTTP client built for ``base_url`` (a model given built is the host's)."""
        if self._client is not None:
            await self._client.close()

    async def __aenter__(self) -> PydanticAIModel:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def stream_step(self, request: ModelRequest) -> AsyncIterator[Part]:
        """Run one step: stream ``request`` to the model and yield its parts as they end."""
        step = _Step()
        try:
            async for part in self._parts(request, step):
                yield part
        except ModelError:
            raise
        except Exception as error:
            mapped = map_error(error, self._id, started=step.started)
            if mapped is None:  # a content filter or refusal: the fallback chain's to take over
                yield Finish(reason=FinishReason.REFUSAL)
                return
            raise mapped from error
        yield self._finish(step)

    async def _parts(self, request: ModelRequest, step: _Step) -> AsyncIterator[Part]:
        from pydantic_ai.direct import model_request_stream
        from pydantic_ai.messages import PartDeltaEvent, PartEndEvent, PartStartEvent, TextPartDelta
        from pydantic_ai.messages import TextPart as PaiTextPart

        ended: set[int] = set()
        async with model_request_stream(
            self._model,
            to_pydantic_messages(request),
            model_settings=_settings(self._settings, request.thinking_level),
            model_request_parameters=request_parameters(request.tools),
            instrument=False,
        ) as response:
            async for event in response:
                step.started = True
                if isinstance(event, PartDeltaEvent):
                    if self._on_text_delta is not None and isinstance(event.delta, TextPartDelta):
                        self._on_text_delta(event.delta.content_delta)
                elif isinstance(event, PartStartEvent):  # a part's first text comes with it
                    if self._on_text_delta is not None and isinstance(event.part, PaiTextPart):
                        self._on_text_delta(event.part.content)
                elif isinstance(event, PartEndEvent):
                    ended.add(event.index)
                    for part in step.book(from_pydantic_part(event.part)):
                        yield part
            leftovers = [p for i, p in enumerate(response.get().parts) if i not in ended]
            for leftover in leftovers:  # parts the stream never reported ended
                for part in step.book(from_pydantic_part(leftover)):
                    yield part
            step.reason = response.finish_reason
            step.usage = Usage(
                input_tokens=response.usage.input_tokens,
                output_tokens=response.usage.output_tokens,
            )

    def _finish(self, step: _Step) -> Finish:
        if step.reason == "error":
            raise ModelError(ErrorType.PROVIDER_ERROR, f"model {self._id!r} finished with an error")
        finish = _FINISH.get(step.reason or "", FinishReason.STOP)
        if step.calls and finish is FinishReason.STOP:
            finish = FinishReason.TOOL_CALLS  # a server that says "stop" after calling tools
        if finish is FinishReason.TOOL_CALLS and not step.calls:
            finish = FinishReason.STOP  # only provider-executed calls: nothing for us to run
        return Finish(reason=finish, usage=step.usage)


class _Step:
    """What one step streamed so far."""

    __slots__ = ("calls", "reason", "started", "usage")

    def __init__(self) -> None:
        self.calls = 0
        #: The response had begun streaming (a lost connection truncates it).
        self.started = False
        self.reason: str | None = None
        self.usage: Usage | None = None

    def book(self, parts: list[Part]) -> list[Part]:
        for part in parts:
            if isinstance(part, ToolCallPart) and not part.provider_executed:
                self.calls += 1
        return parts


# ---------------------------------------------------------------- building the model


def _resolve(model: str | PaiModel, api_key: str | None) -> PaiModel:
    try:
        from pydantic_ai.exceptions import UserError
        from pydantic_ai.models import Model as PaiModelClass
        from pydantic_ai.models import infer_model
    except ImportError as error:
        raise ModelUnavailable(
            f"real models need pydantic-ai, which is not installed ({INSTALL_HINT}): {error}"
        ) from None
    if isinstance(model, PaiModelClass):
        return model
    if not model:
        raise ModelUnavailable(f"a model is a pydantic-ai model name or Model, not {model!r}")
    try:
        if model.startswith("openai:") and api_key is None:
            _require_env(model, "OPENAI_API_KEY")
        return infer_model(model)
    except ModelUnavailable:
        raise
    except ImportError as error:
        raise ModelUnavailable(f"model {model!r} needs a provider extra: {_line(error)}") from None
    except UserError as error:
        raise ModelUnavailable(f"model {model!r}: {_line(error)}") from None
    except Exception as error:  # a provider's client refusing to be built (no key, mostly)
        raise ModelUnavailable(f"model {model!r} could not be built: {_line(error)}") from None


def _compatible(model: str, base_url: str, api_key: str | None) -> tuple[PaiModel, Any]:
    try:
        from openai import AsyncOpenAI
        from pydantic_ai.models.openai import OpenAIChatModel
        from pydantic_ai.providers.openai import OpenAIProvider
    except ImportError as error:
        raise ModelUnavailable(
            f"real models need pydantic-ai, which is not installed ({INSTALL_HINT}): {error}"
        ) from None
    key = api_key or os.environ.get("OPENAI_API_KEY") or "not-needed"
    client = AsyncOpenAI(base_url=base_url, api_key=key, max_retries=0)
    return OpenAIChatModel(model, provider=OpenAIProvider(openai_client=client)), client


def _require_env(model: str, variable: str) -> None:
    if not os.environ.get(variable):
        raise ModelUnavailable(f"model {model!r} needs an API key: {variable} is not set")


def _line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


# ---------------------------------------------------------------- requests


def to_pydantic_messages(request: ModelRequest) -> list[pai_messages.ModelMessage]:
    """The request's history as pydantic-ai messages (system context first)."""
    from pydantic_ai import messages as m

    out: list[m.ModelMessage] = []
    pending: list[m.ModelRequestPart] = []
    if request.extra_system_context:
        pending.append(m.SystemPromptPart(content=request.extra_system_context))
    messages = request.messages
    for index, message in enumerate(messages):
        if message.role is Role.ASSISTANT:
            if pending:
                out.append(m.ModelRequest(parts=pending))
                pending = []
            after = messages[index + 1] if index + 1 < len(messages) else None
            # A provider-executed call's result belongs to the response that made the call.
            provided = after.tool_results if after is not None and after.role is Role.TOOL else ()
            out.append(_response(message, provided))
        else:
            pending.extend(_request_parts(message))
    if pending:
        out.append(m.ModelRequest(parts=pending))
    return out


def _request_parts(message: ChatMessage) -> list[pai_messages.ModelRequestPart]:
    from pydantic_ai import messages as m

    if message.role is Role.SYSTEM:
        return [m.SystemPromptPart(content=message.text)]
    if message.role is Role.USER:
        return [m.UserPromptPart(content=message.text)]
    return [
        m.ToolReturnPart(tool_name=r.name, content=_content(r), tool_call_id=r.call_id)
        for r in message.tool_results
        if not r.provider_executed
    ]


def _content(result: ToolResultPart) -> Any:
    return result.output if result.output is not None else ""


def _response(
    message: ChatMessage, provided: Sequence[ToolResultPart]
) -> pai_messages.ModelResponse:
    from pydantic_ai import messages as m

    parts: list[m.ModelResponsePart] = []
    if message.text:
        parts.append(m.TextPart(content=message.text))
    for call in message.tool_calls:
        if call.provider_executed:
            parts.append(
                m.NativeToolCallPart(
                    tool_name=call.name, args=dict(call.args), tool_call_id=call.call_id
                )
            )
        else:
            parts.append(
                m.ToolCallPart(tool_name=call.name, args=dict(call.args), tool_call_id=call.call_id)
            )
    parts.extend(
        m.NativeToolReturnPart(tool_name=r.name, content=_content(r), tool_call_id=r.call_id)
        for r in provided
        if r.provider_executed
    )
    return m.ModelResponse(parts=parts)


def request_parameters(tools: Sequence[ToolDefinition]) -> ModelRequestParameters:
    """Function tools for client tools; the native tool of that kind for ``provider`` tools.

    Raises:
        ModelError: A ``provider`` tool names no native tool pydantic-ai knows (terminal).
    """
    from pydantic_ai import ToolDefinition as PaiToolDefinition
    from pydantic_ai.models import ModelRequestParameters

    function_tools = [
        PaiToolDefinition(
            name=tool.name,
            description=tool.description or None,
            parameters_json_schema=dict(tool.parameters),
        )
        for tool in tools
        if tool.kind is not ToolKind.PROVIDER
    ]
    native = [_native(tool.name) for tool in tools if tool.kind is ToolKind.PROVIDER]
    return ModelRequestParameters(function_tools=function_tools, native_tools=native)


#: ``provider`` tool names and the pydantic-ai native tool each becomes (built with no argument).
NATIVE_TOOLS = {
    "web_search": "WebSearchTool",
    "web_fetch": "WebFetchTool",
    "code_execution": "CodeExecutionTool",
    "image_generation": "ImageGenerationTool",
    "x_search": "XSearchTool",
}


def _native(name: str) -> Any:
    from pydantic_ai import native_tools

    class_name = NATIVE_TOOLS.get(name)
    if class_name is None:
        raise ModelError(
            ErrorType.PROVIDER_REJECTED,
            f"provider tool {name!r} is no native tool the adapter knows ({sorted(NATIVE_TOOLS)})",
        )
    return getattr(native_tools, class_name)()


def _settings(base: ModelSettings | None, thinking: str | None) -> ModelSettings | None:
    if thinking is None:
        return base
    merged: dict[str, Any] = dict(base or {})
    level = thinking.lower()
    if level in THINKING_LEVELS:
        merged["thinking"] = level
    elif level in _THINKING_OFF:
        merged["thinking"] = False
    else:
        merged["thinking"] = True
    return merged  # type: ignore[return-value]


# ---------------------------------------------------------------- responses


def from_pydantic_part(part: Any) -> list[Part]:
    """A pydantic-ai response part as turnkeeper parts (none for kinds the loop ignores).

    Raises:
        ModelError: A tool call whose arguments are no JSON object (``malformed_output``).
    """
    from pydantic_ai import messages as m

    if isinstance(part, m.TextPart):
        return [TextPart(text=part.content)] if part.content else []
    if isinstance(part, m.ThinkingPart):
        return [ReasoningPart(text=part.content)] if part.content else []
    if isinstance(part, m.NativeToolCallPart):
        return [_call(part, provider=True)]
    if isinstance(part, m.ToolCallPart):
        return [_call(part, provider=False)]
    if isinstance(part, m.NativeToolReturnPart):
        return [
            ToolResultPart(
                call_id=part.tool_call_id,
                name=part.tool_name,
                output=_jsonable(part.content),
                provider_executed=True,
            )
        ]
    return []


def _call(part: Any, *, provider: bool) -> ToolCallPart:
    try:
        args = part.args_as_dict(raise_if_invalid=True)
    except (ValueError, AssertionError) as error:
        raise ModelError(
            ErrorType.MALFORMED_OUTPUT,
            f"the call to {part.tool_name!r} ({part.tool_call_id}) has arguments that are "
            f"no JSON object: {error}",
        ) from None
    return ToolCallPart(
        call_id=part.tool_call_id, name=part.tool_name, args=args, provider_executed=provider
    )


def _jsonable(value: Any) -> object:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return str(value)
    return value


# ---------------------------------------------------------------- failures


def map_error(error: BaseException, model: str, *, started: bool) -> ModelError | None:
    """A pydantic-ai or client failure as a typed model error; ``None``: a refusal finish.

    ``started``: the response had begun streaming (a lost connection then truncates it).
    """
    from pydantic_ai import exceptions as x

    where = f"model {model!r}"
    wait = getattr(error, "retry_after", None)  # pydantic-ai reads Retry-After (AS-32)
    if isinstance(error, x.ContentFilterError):
        return None
    for kind, error_type in _by_class(x):
        if isinstance(error, kind):
            if error_type is ErrorType.PROVIDER_ERROR and started:
                error_type = ErrorType.STREAM_TRUNCATED
            return ModelError(error_type, f"{where}: {_line(error)}", retry_after=wait)
    status = getattr(error, "status_code", None)
    if isinstance(status, int):
        message = f"{where}: HTTP {status}: {_line(error)}"
        return ModelError(_by_status(status), message, retry_after=wait)
    if _is_transport(error):
        error_type = ErrorType.STREAM_TRUNCATED if started else ErrorType.PROVIDER_ERROR
        return ModelError(error_type, f"{where}: the connection failed: {_line(error)}")
    return ModelError(ErrorType.UNKNOWN, f"{where}: {_line(error)}")


def _by_class(x: Any) -> list[tuple[type[BaseException], ErrorType]]:
    """Most specific first: pydantic-ai's categorized failures and their types."""
    return [
        (x.ModelContextWindowExceededError, ErrorType.CONTEXT_EXCEEDED),
        (x.ModelAuthenticationError, ErrorType.AUTHENTICATION),
        (x.ModelNotFoundError, ErrorType.MODEL_NOT_FOUND),
        (x.ModelQuotaExceededError, ErrorType.QUOTA),
        (x.ModelRateLimitError, ErrorType.RATE_LIMITED),
        (x.ModelUnavailableError, ErrorType.PROVIDER_ERROR),
        (x.ModelServerError, ErrorType.PROVIDER_ERROR),
        (x.ModelConnectionError, ErrorType.PROVIDER_ERROR),
        (x.ModelRequestTimeout, ErrorType.PROVIDER_ERROR),
        (x.ModelRequestRejectedError, ErrorType.PROVIDER_REJECTED),
        (x.UnexpectedModelBehavior, ErrorType.MALFORMED_OUTPUT),
    ]


def _by_status(status: int) -> ErrorType:
    if status == 429:
        return ErrorType.RATE_LIMITED
    if status in (401, 403):
        return ErrorType.AUTHENTICATION
    if status == 404:
        return ErrorType.MODEL_NOT_FOUND
    if status >= 500 or status == 408:
        return ErrorType.PROVIDER_ERROR
    return ErrorType.PROVIDER_REJECTED


def _is_transport(error: BaseException) -> bool:
    """An HTTP client's lost connection or broken stream (httpx, the openai client, OSError)."""
    if isinstance(error, OSError):
        return True
    names = {cls.__name__ for cls in type(error).__mro__}
    return bool(
        names
        & {
            "APIConnectionError",
            "APITimeoutError",
            "TransportError",
            "RemoteProtocolError",
            "ReadError",
            "IncompleteRead",
        }
    )
