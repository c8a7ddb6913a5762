"""afterthought: long-term memory for Google ADK agents, backed by Zep, written after the
thought. This package is the core both the agent hooks and the worker import."""

from afterthought.settings import Settings, SettingsError

__version__ = "0.1.0"
__all__ = ["Settings", "SettingsError", "__version__"]
