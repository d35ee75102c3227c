"""The engine commands the UI acts with: the same functions the HTTP API calls.

The UI's one import of the engine's command module, so a rename (to `stevora.engine.commands`)
is a one-line change here.
"""

from stevora.engine.service import (
    Decision,
    cancel_run,
    create_run,
    decide_approval,
    pause_run,
    resume_run,
    retry_run,
)

__all__ = ["Decision", "cancel_run", "create_run", "decide_approval", "pause_run", "resume_run", "retry_run"]
