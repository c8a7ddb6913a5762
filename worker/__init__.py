"""Runs in the arq worker process: persists queued turns to the memory backend."""
