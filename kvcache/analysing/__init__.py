"""The analysing wing: numpy and the standard library only, never torch, transformers or the measuring
wing, so ``kvcache compare`` and ``kvcache report`` run where torch is not installed. Records, the settings and
the model names (presets), run identity, torch's SDPA backend rules (sdpa_rules), the line fit, the one judge
(gate), baselines, the session-end analysis, the summary, compare and report."""
