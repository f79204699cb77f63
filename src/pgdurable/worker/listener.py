"""The listener: one LISTEN session per worker turning NOTIFYs into wake-ups, so that latency does not
depend on polling (which stays as the fallback).

Every worker: a NOTIFY is a wake-up for the worker that receives it. ``work`` (payload: a queue) wakes that
queue's producer; ``schedules`` wakes the scheduler; ``stop`` (payload: an execution id) stops that
execution at once if it runs here (cancelled or timed out), rather than at its next heartbeat.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from .. import channels
from ..db import Database

log = logging.getLogger("pgdurable.worker")


class Listener:
    def __init__(self, db: Database, worker_id: str, *, on_work: Callable[[str | None], None],
                 on_schedules: Callable[[], None], on_stop: Callable[[str], None]) -> None:
        self.db = db
        self.worker_id = worker_id
        self.on_work = on_work  # None: anything may have arrived (catching up after a reconnect)
        self.on_schedules = on_schedules
        self.on_stop = on_stop

    async def run(self) -> None:
        schema = self.db.schema
        work, schedules = channels.channel(schema, "work"), channels.channel(schema, "schedules")
        while True:
            try:
                conn = await self.db.aconnect()
                async with conn:
                    await conn.execute(channels.listen(schema, "work", "stop", "schedules"))
                    self.on_work(None)  # catch up on whatever was enqueued while not listening
                    self.on_schedules()
                    async for notice in conn.notifies():
                        if notice.channel == work:
                            self.on_work(notice.payload)
                        elif notice.channel == schedules:
                            self.on_schedules()
                        else:
                            self.on_stop(notice.payload)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("worker %s: listener lost its connection (%s); polling until it is back",
                            self.worker_id, exc)
                await asyncio.sleep(1.0)
