"""Usage accounting of streams (SM-14, SM-15, R59) and a user abort of a retried turn (AS-23).

Each row a stream leaves records what its steps used, by the model that ran them: a fallback's
usage under the fallback, never under the model the turn asked for. Usage no row records goes
to the session's side ledger; ``AgentSession.usage()`` sums both.
"""

from __future__ import annotations

from agent_session import EngineConfig, RetryAbandoned
from agent_session._rows import decode_body
from persistence import RowKind
from stream_manager import ModelUsage, ScriptStep, ScriptToolCall, StreamStarted, Usage
from tests.agent_session.support import HookTool, Rig, session_rig

CONFIG = EngineConfig(max_stream_steps=8, retry_backoff_s=0.5, compact_at=0.0)


def step(
    tokens: int, *, tool: bool = False, refuse: bool = False, text: str | None = None
) -> ScriptStep:
    calls = (ScriptToolCall(tool="bash"),) if tool else ()
    return ScriptStep(
        tool_calls=calls,
        refuse=refuse,
        text=text,
        usage=Usage(input_tokens=tokens, output_tokens=tokens // 10),
    )


def stop_at_tool(r: Rig) -> None:
    def stop(event: object) -> None:
        if type(event).__name__ == "ToolCallStarted":
            r.session().stop()

    r.on(stop)


async def test_sm15_the_final_row_records_what_the_stream_used() -> None:
    async with session_rig(
        {"M": [step(120, tool=True), step(340, text="done")]}, config=CONFIG
    ) as r:
        r.session().send("go")
        await r.settle()
        final = (await r.history())[-1]
        assert final.kind is RowKind.ASSISTANT
        assert decode_body(final).usage == (
            ModelUsage(model="M", input_tokens=460, output_tokens=46),
        )
        assert await r.session().usage() == decode_body(final).usage


async def test_sm14_r59_an_aborted_fallbacks_partial_is_stamped_under_the_model_it_ran() -> None:
    scripts = {"A": [step(70, refuse=True)], "B": [step(900, tool=True)]}
    async with session_rig(
        scripts, config=CONFIG, fallbacks={"A": ["B"]}, sessions=(("s1", "A"),)
    ) as r:
        stop_at_tool(r)
        r.session().send("go")
        await r.settle()
        partial = (await r.history())[-1]
        assert partial.kind is RowKind.PARTIAL
        assert decode_body(partial).usage == (
            ModelUsage(model="A", input_tokens=70, output_tokens=7),
            ModelUsage(model="B", input_tokens=900, output_tokens=90),
        )


async def test_sm14_an_abandoned_partials_usage_goes_to_the_side_ledger() -> None:
    # an edit abandons the running stream's partial (AS-6): no row records its usage
    script = [step(250, tool=True), step(30, text="the edited turn")]
    tools = [HookTool("bash", duration_s=1.0)]
    async with session_rig({"M": script}, config=CONFIG, tools=tools) as r:
        r.session().send("go")
        await r.time.run_until(0.5)  # the tool is running
        await r.session().edit("s1:r1", "go again")
        await r.settle()
        assert [row.kind for row in await r.history()] == [RowKind.USER, RowKind.ASSISTANT]
        assert r.session()._machine.usage_ledger == (
            ModelUsage(model="M", input_tokens=250, output_tokens=25),
        )
        assert await r.session().usage() == (
            ModelUsage(model="M", input_tokens=280, output_tokens=28),
        )


async def test_as23_a_user_abort_of_a_retried_turn_abandons_the_retry() -> None:
    script = [ScriptStep(error="retryable"), step(10, tool=True), step(10, text="never")]
    async with session_rig({"M": script}, config=CONFIG) as r:
        stop_at_tool(r)
        r.session().send("go")
        await r.settle()
        assert [e.cause for e in r.of(StreamStarted)] == ["send", "retry"]
        (abandoned,) = r.of(RetryAbandoned)
        assert "aborted by the user" in abandoned.why
