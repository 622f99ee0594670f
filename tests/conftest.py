"""The project's tests, by wing: ``analysing/`` (no torch: CI also runs them where torch is not installed),
``measuring/`` (torch and transformers) and ``suite/`` (``pytest benchmarks`` end to end, the faces).
Importing this file puts ``tests/`` on the path, so ``fakerun`` and ``kvrun`` import from any of them."""
