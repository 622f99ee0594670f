"""The analysing wing: numpy and the standard library only, never torch, transformers or the measuring
wing, so ``kvcache compare`` and ``kvcache report`` run where torch is not installed. Records, run
identity, the line fit, the one judge (gate), baselines, the session-end analysis, the summary,
compare and report."""
