"""Throwaway: what the rule extractor reads from sentences given on stdin, one a line."""

import asyncio
import sys

from afterthought.backends.base import HistoryMessage
from afterthought.worker.extract import RuleExtractor


async def main() -> None:
    for i, line in enumerate(x.strip() for x in sys.stdin if x.strip()):
        facts = await RuleExtractor().extract(
            [HistoryMessage(str(i), "user", line, "2025-03-01T10:00:00+00:00")]
        )
        print(f"{line[:70]!r:75} -> {[(f.subject, f.predicate, f.value) for f in facts]}")


asyncio.run(main())
