"""kvcache-passes: how many times each decode step moves its KV cache through memory.

Two wings meet at plain records (:mod:`kvcache.analysing.records`): the measuring wing (torch, transformers)
and the analysing wing (fit, gate, compare, report: numpy only). The pytest plugin
(:mod:`kvcache.plugin`) and the ``kvcache`` command sit on top.
"""

__version__ = "0.1.0"
