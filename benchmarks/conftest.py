"""The suite's own conftest: registers the test-only twins (``twin-clean``, ``twin-planted``) that check
the gates. They live here, not in the production registry, and are not part of ``--kv-caches all``."""

from kvcache.testing import classes as testing

testing.register()
