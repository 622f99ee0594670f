"""Test-only pieces that ship so that an installed package can prove its own gate: cache classes that add a known
number of passes (:mod:`.classes`, registered only by ``benchmarks/conftest.py``) and the B sides of ``kvcache ab``'s
gate-power runs (:mod:`.twin_copy`, :mod:`.twin_layout`, loaded with ``-p``). Nothing here is imported by the suite
unless a test or a ``-p`` asks for it."""
