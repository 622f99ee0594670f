"""What ``kvcache ab`` (:mod:`kvcache.commands.ab`) runs: one session (:mod:`.session`) of two sides (:mod:`.sides`),
each a pytest worker (:mod:`.worker`), stepped through the suite together (:mod:`.schedule`), and their results judged
and written (:mod:`.results`). Standard library only, except the worker, which runs inside a side's pytest."""
