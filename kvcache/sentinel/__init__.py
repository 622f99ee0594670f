"""What ``kvcache sentinel`` (:mod:`kvcache.commands.sentinel`) runs: the state and the walk over a branch or the
releases (:mod:`.watching`), the figures it watches (:mod:`.figures`) and the issue it writes (:mod:`.report`). Standard
library only."""
