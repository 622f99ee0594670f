"""torch's SDPA backend selection transcribed (:mod:`.selection`), per torch release (:mod:`.release_facts`),
for a call described by plain facts (:mod:`.calls`): what a CUDA GPU would run, said on a CPU. Pure Python."""
