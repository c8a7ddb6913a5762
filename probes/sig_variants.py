# ruff: noqa
import asyncio
from afterthought.settings import Settings
from afterthought.backends.base import HistoryMessage
from worker.extract import default_extractor

s = Settings(backend="local", key_prefix="x")
ex = default_extractor(s)
texts = [
    "I'm allergic to peanuts.",
    "I'm allergic to Peanuts!",
    "I'm allergic to ＰＥＡＮＵＴＳ.",
    "I'm allergic to pea\u200bnuts.",
    "I'm allergic to peanuts\u00a0.",
    "I’m allergic to peanuts.",
    "I'm allergic to peanut.",
    "I have a peanut allergy.",
    "I'm allergic to pеanuts.",  # cyrillic e
    "I'm ALLERGIC TO PEANUTS.",
    "i'm allergic to peanuts",
    "I'm allergic to peanuts and shellfish.",
    "I am allergic to peanuts.",
    "Im allergic to peanuts.",
    "I'm allergic to pe\u0301anuts.",
    "Ich bin allergisch gegen Erdnüsse.",
]


async def main():
    base = None
    for i, t in enumerate(texts):
        facts = await ex.extract([HistoryMessage(f"k{i}", "user", t, "2026-12-01T00:00:00+00:00")])
        for f in facts:
            if base is None:
                base = f.signature
            print(
                repr(t),
                "->",
                (f.subject, f.predicate, repr(f.value)),
                "SAME" if f.signature == base else "differs",
            )
        if not facts:
            print(repr(t), "-> nothing")


asyncio.run(main())
