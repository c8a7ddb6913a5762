"""The basic offline example: two ADK sessions of one user, a worker persisting memory in
between, and the second session answering from long-term memory.

    python examples/offline_chat.py                     # starts its own worker process
    python examples/offline_chat.py --external-worker   # a worker runs elsewhere (compose)

The code is ``afterthought/demo.py`` (also ``afterthought demo``): ``conversation()`` is
the part to copy into an agent: ``create_callbacks`` and the two callbacks."""

import sys

from afterthought.demo import main

if __name__ == "__main__":
    sys.exit(main(external_worker="--external-worker" in sys.argv[1:]))
