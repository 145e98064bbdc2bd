"""The refusal fallback chain and the progress that travels with a turn (SM-16, R37-R39).

``ModelFallbackProgress`` is the turn's position on its chain: the model first requested, the
models that refused so far, and the chain itself (which excludes the requested model). It is
handed out with every cut, abort and failure and handed back to every continuation, so a
refusal by a fallback model continues down the *original* chain (R39), and a spent budget buys
no hop (R37).

Pure: plain values in, a decision out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence


class ModelFallbackProgress(msgspec.Struct, frozen=True, kw_only=True):
    """A turn's progress down its fallback chain."""

    requested_model: str
    refused_models: tuple[str, ...] = ()
    #: The models tried, in order, after the requested one refuses.
    chain: tuple[str, ...] = ()


def start_progress(
    model: str,
    chains: Mapping[str, Sequence[str]],
    carried: ModelFallbackProgress | None = None,
) -> ModelFallbackProgress:
    """The progress a stream starts with.

    A continuation passes the progress its predecessor reached (``carried``); the stream then
    uses that chain and those refusals and does not resolve a chain for the model it resumes on
    (ST-13). A fresh turn starts at the requested model's configured chain.
    """
    if carried is not None:
        return carried
    return ModelFallbackProgress(requested_model=model, chain=tuple(chains.get(model, ())))


@dataclass(frozen=True, slots=True)
class Hop:
    """Take the fallback: continue the stream on ``to`` under what is left."""

    to: str
    progress: ModelFallbackProgress


@dataclass(frozen=True, slots=True)
class NoHop:
    """The refusal is terminal (``model_refusal``, never retryable)."""

    note: str
    progress: ModelFallbackProgress


def plan_hop(
    progress: ModelFallbackProgress,
    refusing_model: str,
    *,
    remaining: int,
    stopping: bool,
    incomplete_tool_call: bool,
) -> Hop | NoHop:
    """Decide what a refusal by ``refusing_model`` leads to (SM-16, in its order).

    Args:
        progress: the stream's progress before this refusal.
        refusing_model: the model whose step finished with a refusal.
        remaining: the stream's remainder after charging the refused step.
        stopping: the stream was aborted or a soft stop is pending.
        incomplete_tool_call: the refused output holds a tool call without a result.
    """
    refused = (*progress.refused_models, refusing_model)
    after = msgspec.structs.replace(progress, refused_models=refused)
    if stopping:
        return NoHop("refused while stopping", after)
    index = len(refused) - 1
    if index >= len(progress.chain):
        if not progress.chain:
            return NoHop(f"{refusing_model} refused and no fallback chain is configured", after)
        return NoHop(f"chain exhausted; refused {', '.join(refused)}", after)
    if incomplete_tool_call:
        return NoHop("incomplete tool call in the refused output", after)
    if remaining <= 0:
        return NoHop("the step budget is spent; a spent budget buys no hop", after)
    return Hop(progress.chain[index], after)
