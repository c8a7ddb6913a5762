"""Test support that users can reuse: a loopback Zep v4 fake, a throwaway Redis and a
proxy that makes Redis misbehave.

``pytest_plugins = ["afterthought.testing.pytest_plugin"]`` gives the ``zep_fake`` fixture."""

from afterthought.testing.redis_proxy import RedisProxy
from afterthought.testing.redis_server import RedisServer
from afterthought.testing.zep_fake import Fault, ZepFake

__all__ = ["Fault", "RedisProxy", "RedisServer", "ZepFake"]
