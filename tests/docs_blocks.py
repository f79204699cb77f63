"""Reading the code blocks of README.md and docs/*.md, as tests/test_docs.py runs them.

A page's blocks, in order:
- A ``python`` block whose first line names a file (``# shop.py``, ``# myapp/flows.py``) is that file: every
  such block of a page is written (blocks naming the same file are appended) into the page's directory before
  anything on the page runs, so a worker started by any ``bash`` block imports all of it.
- Other ``python`` blocks run in order in one Python session per page, as in ``python -m asyncio`` (top-level
  ``await`` works); names stay defined from one block to the next.
- ``bash``/``sh``/``shell`` blocks run in the page's directory with ``set -euo pipefail``; what they start in the
  background (``pgdurable worker ... &``) runs until the page ends.
- ``sql`` blocks run one statement at a time, after the page's schema exists.
- ``<!-- docs-test: skip (reason) -->`` on the line before a block skips it; ``<!-- docs-test: rollback -->``
  runs a ``sql`` block in a transaction that is rolled back.
- ``--8<-- "path"`` and ``--8<-- "path:section"`` lines are included as pymdownx.snippets includes them (paths
  from the repository root); a ``python`` block that is only such an include of a file is that file, run by the
  page's other blocks (``python -m examples.checkout``), and here only compiled. Includes outside code blocks
  (a page showing a section of the README) are not run again here: their blocks run where they live.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

RUN = {"python": "python", "py": "python", "bash": "bash", "sh": "bash", "shell": "bash", "sql": "sql"}
# Fences that hold no code to run: command synopses, output, configuration of other tools.
NOT_CODE = {"text", "console-output", "yaml", "toml", "ini", "promql"}

FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<lang>[\w+-]*)[^\n`]*$")
MARKER = re.compile(r"^\s*<!--\s*docs-test:\s*(?P<what>skip|rollback)\b\s*(?P<why>.*?)\s*-->\s*$")
SNIPPET = re.compile(r'^(?P<indent>[ \t]*)-{1,}8<-{1,}[ \t]+"(?P<path>[^"]+)"[ \t]*$')
SECTION = re.compile(r"-{1,}8<-{1,}[ \t]+\[[ \t]*(?P<kind>start|end)[ \t]*:[ \t]*(?P<name>[a-z][-_0-9a-z]*)[ \t]*\]")
FILE_HEADER = re.compile(r"^#\s*(?P<name>(?:[A-Za-z_]\w*/)*[A-Za-z_]\w*\.py)\b")  # shop.py, myapp/flows.py


@dataclass
class Block:
    source: str  # "docs/primitives.md:42"
    lang: str
    code: str
    marker: str | None = None  # "skip" or "rollback"
    reason: str = ""
    included_file: str | None = None  # the block is exactly one snippet include of this file

    @property
    def kind(self) -> str | None:
        return RUN.get(self.lang)

    @property
    def file_name(self) -> str | None:
        """The file a ``python`` block is (``# shop.py`` on its first line), if it is one."""
        if self.kind != "python":
            return None
        match = FILE_HEADER.match(self.code.lstrip("\n").split("\n", 1)[0])
        return match["name"] if match else None


def section_text(text: str, section: str | None) -> str:
    """A file's text as a snippet include gives it: one section, or all of it, without section markers."""
    lines, keep, found = [], section is None, False
    for line in text.splitlines():
        marker = SECTION.search(line)
        if marker:
            if section is not None and marker["name"] == section:
                keep = marker["kind"] == "start"
                found = True
            continue
        if keep:
            lines.append(line)
    if section is not None and not found:
        raise ValueError(f"no section {section!r}")
    return "\n".join(lines) + "\n"


def expand_snippets(text: str, depth: int = 0) -> str:
    out = []
    for line in text.splitlines():
        match = SNIPPET.match(line)
        if not match:
            out.append(line)
            continue
        path, _, section = match["path"].partition(":")
        included = section_text((REPO / path).read_text(), section or None)
        if depth < 3:
            included = expand_snippets(included, depth + 1)
        out.extend(match["indent"] + inc if inc else inc for inc in included.rstrip("\n").splitlines())
    return "\n".join(out) + "\n"


def blocks(path: Path) -> list[Block]:
    """The fenced code blocks of a Markdown file, snippets included, in order."""
    rel = path.relative_to(REPO).as_posix()
    raw_lines = path.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(raw_lines):
        opening = FENCE.match(raw_lines[i])
        if not opening:
            i += 1
            continue
        indent, fence, lang = opening["indent"], opening["fence"], opening["lang"].lower()
        body: list[str] = []
        j = i + 1
        while j < len(raw_lines) and raw_lines[j].strip() != fence:
            line = raw_lines[j]
            body.append(line[len(indent):] if line.startswith(indent) else line.lstrip())
            j += 1
        marker, reason = None, ""
        k = i - 1
        while k >= 0 and not raw_lines[k].strip():
            k -= 1
        if k >= 0 and (m := MARKER.match(raw_lines[k])):
            marker, reason = m["what"], m["why"].strip("() ")
        raw = "\n".join(body) + "\n"
        only = [line for line in body if line.strip()]
        included_file = None
        if len(only) == 1 and (s := SNIPPET.match(only[0])) and ":" not in s["path"]:
            included_file = s["path"]
        found.append(Block(f"{rel}:{i + 1}", lang, expand_snippets(raw), marker, reason, included_file))
        i = j + 1
    return found


def pages() -> list[Path]:
    """The Markdown files whose blocks must run: the README and every page of docs/."""
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
