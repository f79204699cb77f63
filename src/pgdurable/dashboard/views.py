"""What the templates draw, computed in Python: the step timeline, the outcomes chart, JSON with colors,
durations and ages. Everything that reaches HTML from here is escaped (markupsafe) or a number."""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from markupsafe import Markup, escape

from .. import display, monitoring, store

# ---- small formatters -------------------------------------------------------------------------------------


def duration(seconds: float | None) -> str:
    if seconds is None or not isinstance(seconds, int | float) or math.isnan(seconds):
        return ""
    if math.isinf(seconds):
        return "∞" if seconds > 0 else ""
    if seconds >= 1e12:
        return f"{seconds / 86400:.3g} d"
    if seconds < 0:
        seconds = 0.0
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms" if seconds >= 0.001 else f"{seconds * 1000:.2f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} m {int(seconds % 60):02d} s"
    if seconds < 86400:
        return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60):02d} m"
    return f"{int(seconds // 86400)} d {int(seconds % 86400 // 3600)} h"


def between(start: datetime | None, end: datetime | None) -> float | None:
    if start is None or end is None:
        return None
    if isinstance(start, display.ExtremeTime) or isinstance(end, display.ExtremeTime):
        return None  # an infinite or out-of-range time: no meaningful length
    return (end - start).total_seconds()


def ago(when: datetime | None, now: datetime) -> str:
    if when is None:
        return ""
    if isinstance(when, display.ExtremeTime):
        return display.format_time(when)
    seconds = (now - when).total_seconds()
    if seconds < 0:
        return "in " + duration(-seconds)
    return duration(seconds) + " ago"


def utc(when: datetime | None) -> str:
    return display.format_time(when, UTC)


def iso(when: datetime | None) -> str:
    if when is None:
        return ""
    if isinstance(when, display.ExtremeTime):
        return when.source
    return when.astimezone(UTC).isoformat()


def wait_text(reason: str | None) -> str:
    """What a waiting execution waits for, in words (the reason is data: escaped by the template)."""
    if not reason:
        return ""
    if reason.startswith("recv:"):
        topic = reason[len("recv:"):]
        return f"a message on topic {topic!r}" if topic else "a message"
    return _WAITS.get(reason, reason)


_WAITS = {"delay": "its delayed start", "sleep": "a durable sleep", "children": "child workflows",
          "parked": "a worker whose code replays its history (parked)"}


def status_class(status: str) -> str:
    """A CSS-safe class for any status string; statuses the stylesheet does not know look neutral."""
    return "st-" + (re.sub(r"[^a-z0-9]+", "-", status.lower()).strip("-")[:30] or "unknown")


def size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KB", "MB"):
        if value < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GB"


def url(path: str, **params: Any) -> str:
    kept = {k: v for k, v in params.items() if v not in (None, "")}
    return path + ("?" + urlencode(kept) if kept else "")


# ---- JSON -------------------------------------------------------------------------------------------------

# Of a value nested too deeply to draw, this many characters of its text are shown.
TOO_DEEP_SHOWN = 2000

_JSON_TOKEN = re.compile(
    r'(?P<key>"(?:\\.|[^"\\])*")(?=\s*:)|(?P<str>"(?:\\.|[^"\\])*")'
    r"|(?P<num>-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)|(?P<lit>\btrue\b|\bfalse\b|\bnull\b)")


def json_html(text: str | None) -> Markup:
    """Stored JSON, indented, with keys, strings, numbers and literals in spans for color. Text that does not
    parse (a cut preview) is shown as it is; JSON nested too deeply to draw is shown as its text (cut), with
    a note. Every piece is escaped."""
    if text is None:
        return Markup("")
    try:
        pretty = json.dumps(display.load_json(text), indent=2, ensure_ascii=False)
    except display.TooDeep as exc:
        return Markup('<span class="muted">({})</span>\n').format(str(exc)) + escape(text[:TOO_DEEP_SHOWN])
    except ValueError:
        return escape(text)
    parts: list[Markup] = []
    position = 0
    for match in _JSON_TOKEN.finditer(pretty):
        parts.append(escape(pretty[position:match.start()]))
        kind = match.lastgroup or "str"
        parts.append(Markup('<span class="j-{}">{}</span>').format(kind, match.group(0)))
        position = match.end()
    parts.append(escape(pretty[position:]))
    return Markup("").join(parts)


# ---- keyset cursors ---------------------------------------------------------------------------------------


def encode_cursor(created_at: datetime, workflow_id: str) -> str:
    # An ExtremeTime's isoformat is PostgreSQL's own text of it (infinity, a year past 9999): exact paging.
    raw = json.dumps([created_at.isoformat(), workflow_id], ensure_ascii=False).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(text: str | None) -> tuple[datetime, str] | None:
    if not text:
        return None
    try:
        at, workflow_id = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
        when = display.parse_time(str(at))
    except (ValueError, TypeError, binascii.Error, RecursionError):
        return None
    return (when, str(workflow_id)) if when is not None else None


# ---- the step timeline ------------------------------------------------------------------------------------

TIMELINE_WIDTH = 1000.0


@dataclass(frozen=True, slots=True)
class Bar:
    label: str
    kind: str  # delay, queue, step, error, wait, current
    x: float
    width: float
    seconds: float | None
    note: str
    step: monitoring.StepDetail | None = None


@dataclass(frozen=True, slots=True)
class Timeline:
    bars: list[Bar]
    total_seconds: float
    ticks: list[tuple[float, str]]
    # steps left out of the drawing (a long workflow draws its first TIMELINE_STEPS)
    hidden_steps: int = 0


TIMELINE_STEPS = 300


def timeline(detail: monitoring.ExecutionDetail, steps: list[monitoring.StepDetail], now: datetime) -> Timeline:
    """A Gantt-like row per phase: delayed start, waiting in the queue, each recorded step, and what is
    running or waited for now, on one time axis from the execution's creation to its end (or now)."""
    created = detail.time("created_at") or now
    available = detail.time("available_at")
    started = detail.time("started_at")
    # available_at is the start time until the first start; later waits and wake-ups overwrite it
    if started is not None and available is not None and available > started:
        available = None
    finished = detail.time("completed_at") if detail.status in store.executions.TERMINAL else None
    end = finished or now
    step_ends = [t for s in steps if (t := s.time("completed_at")) is not None]
    total = max([(end - created).total_seconds(), *[(t - created).total_seconds() for t in step_ends], 1e-3])

    def bar(label: str, kind: str, start: datetime, stop: datetime, note: str = "",
            step: monitoring.StepDetail | None = None) -> Bar:
        seconds = (stop - start).total_seconds()
        x = min(max(0.0, (start - created).total_seconds() / total * TIMELINE_WIDTH), TIMELINE_WIDTH - 2.0)
        width = min(max(seconds / total * TIMELINE_WIDTH, 2.0), TIMELINE_WIDTH - x)  # even 1 ms shows
        return Bar(label, kind, x, width, seconds, note, step)

    bars: list[Bar] = []
    queued_from = created
    if available is not None and available > created:
        bars.append(bar("delayed start", "delay", created, min(available, end)))
        queued_from = available
    if queued_from < end:
        queue_end = started if started is not None else end
        if queue_end > queued_from or started is None:
            bars.append(bar("in queue", "queue", queued_from, max(queue_end, queued_from),
                            "" if started is not None else "not started yet"))
    for step in steps[:TIMELINE_STEPS]:
        begin, stop = step.time("started_at"), step.time("completed_at")
        if begin is None or stop is None:
            continue
        notes = []
        if step.attempts > 1:
            notes.append(f"{step.attempts} attempts")
        recorded_by = step.fields.get("recorded_by_attempt")
        if isinstance(recorded_by, int) and recorded_by > 1:
            notes.append(f"recorded by attempt {recorded_by}")
        bars.append(bar(step.name, "error" if step.error else "step", begin, stop, ", ".join(notes), step))
    if finished is None and detail.status == "running":
        last = max([started or created, *step_ends])
        bars.append(bar("running", "current", last, now, "in progress"))
    if finished is None and detail.status == "waiting" and started is not None:
        last = max([started, *step_ends])
        wake = detail.time("available_at")
        if wake is None:
            note = "until woken"
        else:
            note = "wakes in " + duration((wake - now).total_seconds()) if wake > now else "due"
        bars.append(bar("waiting for " + wait_text(detail.fields.get("wait_reason")), "wait", last,
                        max(last, now), note))
    ticks = [(TIMELINE_WIDTH * f / 4, duration(total * f / 4) if f else "0") for f in range(5)]
    return Timeline(bars, total, ticks, max(0, len(steps) - TIMELINE_STEPS))


# ---- the outcomes chart -----------------------------------------------------------------------------------

CHART_WIDTH, CHART_HEIGHT = 600.0, 100.0
_STACK = ("succeeded", "failed", "cancelled")


@dataclass(frozen=True, slots=True)
class Segment:
    status: str
    y: float
    height: float


@dataclass(frozen=True, slots=True)
class Column:
    x: float
    width: float
    segments: list[Segment]
    title: str


@dataclass(frozen=True, slots=True)
class Chart:
    columns: list[Column]
    peak: int
    statuses: list[str]
    totals: dict[str, int]
    start_label: str
    end_label: str


def outcome_chart(outcomes: monitoring.Outcomes, now: datetime) -> Chart:
    """Stacked bars of finished executions per bucket; the tallest bar fills the height."""
    buckets = outcomes.buckets
    statuses = [s for s in _STACK if s in outcomes.statuses()] + [s for s in outcomes.statuses() if s not in _STACK]
    peak = max([sum(b.values()) for b in buckets] + [0])
    scale = CHART_HEIGHT / peak if peak else 0.0
    slot = CHART_WIDTH / max(len(buckets), 1)
    columns = []
    for i, bucket in enumerate(buckets):
        start = now - timedelta(seconds=outcomes.bucket_seconds * (len(buckets) - i))
        segments, top = [], CHART_HEIGHT
        for status in statuses:
            n = bucket.get(status, 0)
            if n:
                height = max(n * scale, 1.0)
                top -= height
                segments.append(Segment(status, top, height))
        counts = ", ".join(f"{bucket[s]} {s}" for s in statuses if bucket.get(s)) or "nothing finished"
        columns.append(Column(i * slot + slot * 0.1, slot * 0.8, segments,
                              f"{start.astimezone(UTC):%H:%M} UTC: {counts}"))
    window = outcomes.bucket_seconds * len(buckets)
    return Chart(columns, peak, statuses, {s: outcomes.total(s) for s in statuses},
                 f"{duration(window)} ago", "now")


def detail_extras(detail: monitoring.ExecutionDetail) -> list[tuple[str, Any]]:
    """Columns the page has no place for (added by later migrations: parent, deadline, version...)."""
    return [(k, v) for k, v in sorted(detail.fields.items()) if k not in _SHOWN_FIELDS and v is not None]


_SHOWN_FIELDS = frozenset({
    "id", "name", "queue", "status", "priority", "owner_id", "lease_expires", "attempt", "recoveries",
    "max_recoveries", "available_at", "created_at", "updated_at", "started_at", "completed_at", "seq",
    "wait_reason", "parent_id", "forked_from", "deadline", "timeout_seconds", "app_version",
    # internal: the wake-up counter waits and sends meet on
    "wakeups",
})


def as_text(value: Any) -> str:
    return value if isinstance(value, str) else display.dumps(value, ensure_ascii=False)
