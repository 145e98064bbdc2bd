"""agent_session: the session and the engine a host embeds.

Owns the ``Engine`` (the composition root), the ``AgentSession`` state machine (phases, the send
pipeline, queue drain, stops), the owed continuation and its idempotent idle sweep, the owner's
claim and settlement of delegated turns, admission ports, auto-retry, startup recovery, the
scenario harness and the ``turnkeeper`` CLI.

May import every other package; nothing imports it.
"""
