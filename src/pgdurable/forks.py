"""A process forked from one that used pgdurable starts without the parent's connections and threads.

A forked child (multiprocessing's default start method on Linux before Python 3.14, gunicorn's and Celery's
prefork workers) inherits the parent's open connections, and sharing a server session between two
processes interleaves their messages: each reads answers meant for the other (an enqueue returned another
process's row was seen here). It also inherits objects whose threads did not come along (a pool's
workers, the results listener, ``App.start``'s worker), and locks another thread held at the fork.

Whatever holds such state registers here; in a forked child it forgets it and opens anew on next use. It
never closes what it inherited: closing a connection ends its server session, which is still the parent's.
The forgotten objects are kept for the child's lifetime, so that collecting them closes nothing either.
"""

from __future__ import annotations

import os
import weakref
from typing import Any, Protocol


class Inherits(Protocol):
    def _forget_inherited(self) -> list[Any]:
        """Drop the state a forked child must not use; return what was dropped (kept, never closed)."""


_holders: weakref.WeakSet[Any] = weakref.WeakSet()
_kept: list[Any] = []


def forget_in_forked_child(holder: Inherits) -> None:
    _holders.add(holder)


def _after_fork_in_child() -> None:
    for holder in list(_holders):
        _kept.extend(holder._forget_inherited())


os.register_at_fork(after_in_child=_after_fork_in_child)
