"""One page's Python session for tests/test_docs.py: runs the ``python`` blocks it reads on stdin in one
namespace, as ``python -m asyncio`` would (top-level ``await`` works), and answers each on stdout.

Protocol: one JSON line in per block (``{"name": ..., "code": ...}``), one JSON line out (``{"ok": true}`` or
``{"ok": false, "error": traceback}``). What the blocks print goes to stderr, the page's log. At end of input
every ``pgdurable.App`` left in the namespace is closed, as a program's exit would."""

from __future__ import annotations

import ast
import asyncio
import contextlib
import inspect
import json
import sys
import traceback
from typing import Any


def main() -> None:
    namespace: dict[str, Any] = {"__name__": "__main__"}
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    protocol = sys.stdout
    for line in sys.stdin:
        block = json.loads(line)
        try:
            with contextlib.redirect_stdout(sys.stderr):
                code = compile(block["code"], block["name"], "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
                result = eval(code, namespace)
                if inspect.iscoroutine(result):
                    loop.run_until_complete(result)
            answer: dict[str, Any] = {"ok": True}
        except BaseException:
            answer = {"ok": False, "error": traceback.format_exc()}
        protocol.write(json.dumps(answer) + "\n")
        protocol.flush()
    import pgdurable

    for value in list(namespace.values()):
        if isinstance(value, pgdurable.App):
            value.close()
    loop.close()


if __name__ == "__main__":
    main()
