"""``python -m agent_session`` runs the ``turnkeeper`` command line."""

from agent_session.cli import main

raise SystemExit(main())
