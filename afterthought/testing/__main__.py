"""``python -m afterthought.testing --port 8011 --latency 0.15``: serve the Zep fake."""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading

from afterthought.testing.zep_fake import ZepFake


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m afterthought.testing")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8011)
    parser.add_argument("--latency", type=float, default=0.0, help="seconds added to each call")
    parser.add_argument("--fault-rate", type=float, default=0.0, help="share failed at random")
    parser.add_argument(
        "--ignore-idempotency", action="store_true", help="apply replayed keyed requests again"
    )
    parser.add_argument("--seed", type=int, help="seed of the random faults")
    args = parser.parse_args(argv)
    fake = ZepFake(
        host=args.host,
        port=args.port,
        latency=args.latency,
        fault_rate=args.fault_rate,
        honor_idempotency=not args.ignore_idempotency,
        seed=args.seed,
    ).start()
    print(f"zep fake listening: ZEP_BASE_URL={fake.base_url}", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with contextlib.suppress(KeyboardInterrupt):
        stop.wait()
    fake.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
