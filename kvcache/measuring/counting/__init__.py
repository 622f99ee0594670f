"""Counted traffic: what one ATen op reads and writes, the counter, the attention probe, counted memory, the
step under each SDPA backend, and a class's counts in a session."""
