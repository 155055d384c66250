"""An event loop whose timers fire early by `time.monotonic()`, as uvloop's can: it reads its
own clock once per loop iteration (and in whole milliseconds), so a timer set late in a busy
iteration is due before its time by any other clock."""

from __future__ import annotations

import asyncio

EARLY_S = 0.005


class EarlyLoop(asyncio.SelectorEventLoop):
    """Every timer (`call_later`, `call_at`, `asyncio.timeout`) fires EARLY_S before its time."""

    def call_at(self, when, callback, *args, context=None):
        return super().call_at(when - EARLY_S, callback, *args, context=context)
