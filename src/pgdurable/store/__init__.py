"""Every statement the engine runs, as data, by subject; ``calls``: what a statement is and how one runs.

Call sites say where a statement lives: ``store.run(conn, store.executions.get_execution(id))``.
"""

from . import calls, checkpoints, children, claims, executions, messaging, queues, versions, workers
from .calls import Call, arun, run

__all__ = ["Call", "arun", "calls", "checkpoints", "children", "claims", "executions", "messaging", "queues",
           "run", "versions", "workers"]
