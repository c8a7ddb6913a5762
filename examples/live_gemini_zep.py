"""The offline example's conversation for real: Gemini answers and Zep Cloud remembers.

    GOOGLE_API_KEY=... ZEP_API_KEY=... python examples/live_gemini_zep.py

Redis as in the offline example (``REDIS_URL``, the local one, or a private one); a worker
process is started for the run. Without both keys it says which is missing and exits 2."""

import asyncio
import os
import sys

from afterthought.demo import conversation, demo_deployment

NEEDED = {
    "GOOGLE_API_KEY": "a Gemini API key (https://aistudio.google.com/apikey)",
    "ZEP_API_KEY": "a Zep Cloud project key (https://app.getzep.com)",
}


def main() -> int:
    missing = [name for name in NEEDED if not os.environ.get(name)]
    if missing:
        for name in missing:
            print(f"live example: set {name}, {NEEDED[name]}", file=sys.stderr)
        print("live example: for an offline run use examples/offline_chat.py", file=sys.stderr)
        return 2
    with demo_deployment() as settings:
        asyncio.run(conversation(settings))
    return 0


if __name__ == "__main__":
    sys.exit(main())
