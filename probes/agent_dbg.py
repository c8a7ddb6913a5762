"""tests.one_shot_agent, with the stop signal's flush reporting what it found (stderr)."""
import asyncio
import sys
import time

from afterthought import enqueue

orig = enqueue._spool_held


def traced() -> None:
    t = time.monotonic()
    for e in list(enqueue._ENQUEUERS):
        print(f"DBG before: buffered={e.buffered} in_flight={sum(len(b) for b in e._in_flight.values())} "
              f"drainer_alive={e._drainer.alive} replay_due={e._replay_due}", file=sys.stderr, flush=True)
    orig()
    for e in list(enqueue._ENQUEUERS):
        print(f"DBG after {time.monotonic()-t:.3f}s: buffered={e.buffered} spooled={e.spooled} dropped={e.dropped}",
              file=sys.stderr, flush=True)


enqueue._spool_held = traced
enqueue.atexit.unregister(orig)
enqueue.atexit.register(traced)
print(f"DBG enqueuers at start={len(enqueue._ENQUEUERS)}", file=sys.stderr, flush=True)

from tests.one_shot_agent import main  # noqa: E402

asyncio.run(main(sys.argv[1], sys.argv[2]))
