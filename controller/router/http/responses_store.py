"""The responses kept for `previous_response_id` and `GET`/`DELETE /v1/responses/{id}`: for each
API key, its last `size` responses (least recently used first out), in this HTTP server's memory.

A key's responses are its own: another key is told, for an id it did not store, what it is told
for an id no one stored. With no keys set every client is one, and shares one store. Each key is
kept as its SHA-256 only, not the key itself.

What one response holds: its Response object, and the conversation it ended (the turns it was
generated from, then its own reply as the next assistant turn), for the response that continues
it. A conversation shares its earlier turns with the response it continued (a tuple of the same
turn objects), so that a chain of n responses keeps its turns once; what one response's
conversation holds is at most what one routed request carried (the router refuses more) and its
reply. NOTE: the store is this process's: behind several routers, a response is found only on
the router that made it.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from intentserve.controller.router.http.openai_chat_schema import ChatMessage

# Responses kept per key (`spec.controller.http.responsesStoreSize`). 256: a chain needs only
# its last response, so a key holds 256 conversations in progress, or that many to GET; one
# response is at most what a router forwards (MAX_REQUEST_BYTES, 4 MiB) and its reply, so a
# key's store is at most about 1 GiB where every conversation is that large, and a few MB for
# conversations of a few KB (a chat's usual turns).
DEFAULT_RESPONSES_STORE_SIZE = 256


@dataclass(frozen=True)
class StoredResponse:
    response: dict[str, Any]  # the Response object, as it was answered
    conversation: tuple[ChatMessage, ...]  # without instructions (the next request gives its own)


class ResponsesStore:
    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"a store holds at least 1 response per key, not {size}")
        self.size = size
        self._by_owner: dict[str | None, OrderedDict[str, StoredResponse]] = {}

    def put(self, key: str | None, response_id: str, stored: StoredResponse) -> None:
        """Keep `stored` under `key` (None: the store every client shares), dropping that key's
        least recently used response past `size`."""
        kept = self._by_owner.setdefault(_owner(key), OrderedDict())
        kept[response_id] = stored
        kept.move_to_end(response_id)
        while len(kept) > self.size:
            kept.popitem(last=False)

    def get(self, key: str | None, response_id: str) -> StoredResponse | None:
        """The response `key` stored under `response_id` (now its most recently used), or
        None: never stored, dropped, deleted, or another key's."""
        kept = self._by_owner.get(_owner(key))
        if kept is None or response_id not in kept:
            return None
        kept.move_to_end(response_id)
        return kept[response_id]

    def delete(self, key: str | None, response_id: str) -> bool:
        """Whether `key` had it (then it is gone)."""
        kept = self._by_owner.get(_owner(key))
        return kept is not None and kept.pop(response_id, None) is not None

    def num_stored(self) -> int:
        """Every key's responses."""
        return sum(len(kept) for kept in self._by_owner.values())


def _owner(key: str | None) -> str | None:
    return None if key is None else hashlib.sha256(key.encode()).hexdigest()
