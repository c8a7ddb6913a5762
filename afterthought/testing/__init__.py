"""Test support that users can reuse: a loopback Zep v4 fake, a throwaway Redis and a
proxy that makes Redis misbehave.

``pytest_plugins = ["afterthought.testing.pytest_plugin"]`` gives the ``zep_fake`` fixture."""

from typing import TYPE_CHECKING, Any

from afterthought.testing.redis_proxy import RedisProxy
from afterthought.testing.redis_server import RedisServer
from afterthought.testing.zep_fake import Fault, ZepFake

if TYPE_CHECKING:
    from afterthought.testing.stand_in_model import StandInLlm

__all__ = ["Fault", "RedisProxy", "RedisServer", "StandInLlm", "ZepFake"]


def __getattr__(name: str) -> Any:
    # The scripted model imports google-adk: only when asked for (the fake needs none).
    if name == "StandInLlm":
        from afterthought.testing.stand_in_model import StandInLlm

        return StandInLlm
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
