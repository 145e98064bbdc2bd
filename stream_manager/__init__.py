"""stream_manager: the model step loop.

Owns the step loop, the step budget shared by every cut, resume and retry of one logical turn,
the stop conditions, the fallback chain and its progress, soft and hard stops and their abort
reasons, the launch probe, tool calls as operations (deadlines, cancellation, receipts), the
``Model``, ``Tool`` and ``Clock`` ports and the ``ScriptedModel``.

May import ``message_queue`` and ``persistence``. Must never import ``agent_session``.
"""
