"""Extras around the core: test helpers, the pytest plugin and a throwaway Redis server."""
