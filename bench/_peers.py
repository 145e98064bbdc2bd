"""The peers' side of the comparisons: the same scripted work through each peer framework.

Every peer is optional (the ``bench`` extra, pinned in pyproject.toml): it is imported with
``importlib.import_module`` so ``make test``'s mypy (which runs without the extra) and a machine
without a peer both work; a missing peer is reported as "not installed". Module attributes
reached that way are ``Any`` to mypy: the peers' own types are not checked here.

A turn of N steps is the same everywhere: the model returns one call of the no-op tool ``noop``
for N-1 steps, then the text ``done``. Each ``*_turn`` coroutine builds its agent (not timed),
then times the run alone and returns µs per step.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

Turn = Callable[[int], Awaitable[float]]


@dataclass(frozen=True, slots=True)
class Peer:
    """One peer system: its name, the distribution that carries it, and its import check."""

    name: str
    distribution: str
    modules: tuple[str, ...]

    def version(self) -> str | None:
        """The installed version, or ``None`` when the peer (or one of its modules) is absent."""
        try:
            for module in self.modules:
                importlib.import_module(module)
            return importlib.metadata.version(self.distribution)
        except ImportError:
            return None


PYDANTIC_AI = Peer("pydantic-ai", "pydantic-ai-slim", ("pydantic_ai",))
LANGGRAPH = Peer("LangGraph", "langgraph", ("langgraph", "langchain_core"))
LANGGRAPH_SQLITE = Peer(
    "LangGraph", "langgraph-checkpoint-sqlite", ("langgraph.checkpoint.sqlite.aio",)
)
AGENTS_SDK = Peer("OpenAI Agents SDK", "openai-agents", ("agents",))
PEERS = (PYDANTIC_AI, LANGGRAPH, AGENTS_SDK)


def _m(name: str) -> ModuleType:
    return importlib.import_module(name)


def _timed_us(start: int, steps: int) -> float:
    return (time.perf_counter_ns() - start) / steps / 1_000


# -- pydantic-ai ------------------------------------------------------------------------------


def pydantic_ai_agent(steps: int) -> Any:  # Any: pydantic_ai.Agent, untyped here
    """A pydantic-ai Agent on a FunctionModel playing the script, with the no-op tool."""
    messages = _m("pydantic_ai.messages")
    function = _m("pydantic_ai.models.function")
    played = 0

    def model(history: list[Any], info: Any) -> Any:
        nonlocal played
        played += 1
        if played < steps:
            call = messages.ToolCallPart(tool_name="noop", args={}, tool_call_id=f"c{played}")
            return messages.ModelResponse(parts=[call])
        return messages.ModelResponse(parts=[messages.TextPart("done")])

    agent = _m("pydantic_ai").Agent(function.FunctionModel(model))

    @agent.tool_plain  # type: ignore[untyped-decorator]  # pydantic_ai reached as Any
    def noop() -> dict[str, bool]:
        """Do nothing."""
        return {"ok": True}

    return agent


def no_request_limit() -> Any:  # Any: pydantic_ai.usage.UsageLimits
    """pydantic-ai stops a run at 50 requests by default; a 100-step turn needs 100."""
    return _m("pydantic_ai.usage").UsageLimits(request_limit=None)


async def pydantic_ai_turn(steps: int) -> float:
    """µs per step of one pydantic-ai run, in memory."""
    agent = pydantic_ai_agent(steps)
    limits = no_request_limit()
    start = time.perf_counter_ns()
    result = await agent.run("go", usage_limits=limits)
    elapsed = _timed_us(start, steps)
    _check(len(result.all_messages()) == 2 * steps, "pydantic-ai", steps)
    return elapsed


# -- LangGraph --------------------------------------------------------------------------------


def langgraph_builder(steps: int) -> Any:  # Any: langgraph.graph.StateGraph
    """A StateGraph: a model node on a fake chat model, a ToolNode with the no-op tool."""
    core_messages = _m("langchain_core.messages")
    fake = _m("langchain_core.language_models.fake_chat_models")
    graph = _m("langgraph.graph")
    prebuilt = _m("langgraph.prebuilt")

    def noop() -> dict[str, bool]:
        """Do nothing."""
        return {"ok": True}

    tool = _m("langchain_core.tools").tool(noop)
    script = [
        core_messages.AIMessage(
            content="", tool_calls=[{"name": "noop", "args": {}, "id": f"c{index}"}]
        )
        for index in range(steps - 1)
    ] + [core_messages.AIMessage(content="done")]
    chat = fake.GenericFakeChatModel(messages=iter(script))

    async def model(state: dict[str, Any]) -> dict[str, Any]:
        return {"messages": [await chat.ainvoke(state["messages"])]}

    builder = graph.StateGraph(graph.MessagesState)
    builder.add_node("model", model)
    builder.add_node("tools", prebuilt.ToolNode([tool]))
    builder.add_edge(graph.START, "model")
    builder.add_conditional_edges("model", prebuilt.tools_condition)
    builder.add_edge("tools", "model")
    return builder


def langgraph_input() -> dict[str, Any]:
    """The graph's input: one human message."""
    return {"messages": [_m("langchain_core.messages").HumanMessage("go")]}


async def langgraph_turn(steps: int) -> float:
    """µs per step of one LangGraph invocation, in memory (no checkpointer)."""
    app = langgraph_builder(steps).compile()
    start = time.perf_counter_ns()
    state = await app.ainvoke(langgraph_input(), {"recursion_limit": 2 * steps + 5})
    elapsed = _timed_us(start, steps)
    _check(len(state["messages"]) == 2 * steps, "LangGraph", steps)
    return elapsed


# -- OpenAI Agents SDK ------------------------------------------------------------------------


def agents_sdk_agent(steps: int) -> Any:  # Any: agents.Agent
    """An Agents SDK Agent on a scripted Model subclass, with the no-op function tool."""
    agents = _m("agents")
    agents.set_tracing_disabled(True)
    responses = _m("openai.types.responses")
    interface = _m("agents.models.interface")
    items = _m("agents.items")
    usage = _m("agents.usage")

    base: Any = interface.Model  # the Agents SDK's Model, reached through importlib

    class Scripted(base):  # type: ignore[misc]  # subclassing Any
        played = 0

        async def get_response(self, *args: Any, **kwargs: Any) -> Any:
            self.played += 1
            if self.played < steps:
                output = [
                    responses.ResponseFunctionToolCall(
                        type="function_call",
                        call_id=f"c{self.played}",
                        name="noop",
                        arguments="{}",
                        id=f"fc{self.played}",
                        status="completed",
                    )
                ]
            else:
                text = responses.ResponseOutputText(type="output_text", text="done", annotations=[])
                output = [
                    responses.ResponseOutputMessage(
                        id="m", type="message", role="assistant", status="completed", content=[text]
                    )
                ]
            return items.ModelResponse(output=output, usage=usage.Usage(), response_id=None)

        def stream_response(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError("the benchmark does not stream")

    def noop() -> dict[str, bool]:
        """Do nothing."""
        return {"ok": True}

    return agents.Agent(name="bench", model=Scripted(), tools=[agents.function_tool(noop)])


async def agents_sdk_turn(steps: int) -> float:
    """µs per step of one Agents SDK run, in memory (no session)."""
    agent = agents_sdk_agent(steps)
    runner = _m("agents").Runner
    start = time.perf_counter_ns()
    result = await runner.run(agent, "go", max_turns=steps + 1)
    elapsed = _timed_us(start, steps)
    _check(len(result.to_input_list()) == 2 * steps, "Agents SDK", steps)
    return elapsed


def _check(ok: bool, who: str, steps: int) -> None:
    if not ok:
        raise AssertionError(f"the {who} benchmark turn did not run {steps} steps")


IN_MEMORY: dict[Peer, Turn] = {
    PYDANTIC_AI: pydantic_ai_turn,
    LANGGRAPH: langgraph_turn,
    AGENTS_SDK: agents_sdk_turn,
}
