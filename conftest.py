"""Loads the kvcache-passes pytest plugin: options (--kv-*), fixtures, session-end analysis and gate."""

pytest_plugins = ["kvcache.plugin"]
