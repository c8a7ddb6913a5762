"""What the worker does after a backend error: one table, by error kind (W5).

- ``retry``: transient; retried in the job with jittered backoff, then the thread is
  deferred with capped backoff; a message that never succeeds is dead-lettered once the
  attempts or age limit is reached (settings ``retry_max_*``).
- ``pause``: the key is refused; every worker pauses (a bad key must not dead-letter the
  world).
- ``resplit``: too large; fewer messages per call, then smaller parts.
- ``narrow``: the backend refuses the content; the batch is bisected down to the message
  it refuses, which alone is dead-lettered.
- ``dead_letter``: the whole batch cannot go where it is addressed.

``unknown_outcome``: the call may have been stored although it failed (a timeout, a lost
reply, a 5xx after the work): before the next attempt the worker waits for the server to
settle and reads back what landed, sending only the rest."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from afterthought.backends.base import BackendError, ErrorKind

Action = Literal["retry", "pause", "resplit", "narrow", "dead_letter"]


@dataclass(frozen=True, slots=True)
class Decision:
    action: Action
    unknown_outcome: bool = False


DECISIONS: dict[ErrorKind, Decision] = {
    "timeout": Decision("retry", unknown_outcome=True),
    "unavailable": Decision("retry", unknown_outcome=True),
    # A reply we could not parse may well report a stored call.
    "invalid_response": Decision("retry", unknown_outcome=True),
    # 409 on a write is an idempotency conflict (the key is in use or was): reconcile, go on.
    "conflict": Decision("retry", unknown_outcome=True),
    "rate_limited": Decision("retry"),
    "unauthorized": Decision("pause"),
    "too_large": Decision("resplit"),
    "bad_request": Decision("narrow"),
    "not_found": Decision("dead_letter"),
}

#: Deferred attempts after which a failing batch is narrowed to its head message, so a
#: poisoned message is found and the ones behind it are not held to its fate.
NARROW_AFTER = 3


def decide(error: BackendError) -> Decision:
    return DECISIONS[error.kind]
