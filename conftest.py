"""Nothing to load here: the kvcache-passes plugin is installed as the ``pytest11`` entry point
``kvcache.plugin`` (pyproject.toml), so it is active in every pytest run of an environment where the package
is installed, this repository's included. This file marks the repository root for pytest (its directory
goes first on ``sys.path``, so a checkout's ``kvcache`` is the one its tests import)."""
