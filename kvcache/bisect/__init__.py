"""What ``kvcache bisect`` (:mod:`kvcache.commands.bisect`) and ``kvcache sentinel`` run: a probe and the counted suite
it runs (:mod:`.probing`, with :mod:`.gates_plugin` inside the probe's pytest and :mod:`.server`, the fork server), the
range to walk (:mod:`.plan`, :mod:`.runners`: git commits or published releases), the walk (:mod:`.walk`), its
judging (:mod:`.search`) and its output (:mod:`.report`); :mod:`.versions_table` renders the probes of many releases
as one table (``make versions``). Standard library only."""
