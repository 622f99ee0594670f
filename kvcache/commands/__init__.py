"""One module per ``kvcache`` command (:data:`kvcache.cli.COMMANDS`): ``kvcache X`` runs ``kvcache.commands.X.main``,
one call of the runner (:func:`kvcache.cli.run`: the parse, the usage-error exit, the signal rule). A command module
is its ``parser()`` and its ``work``; what it does lives in a wing or in the command's own package (:mod:`kvcache.ab`,
:mod:`kvcache.bisect`, :mod:`kvcache.sentinel`). Nothing is imported here: ``kvcache compare`` must not pay for
``kvcache traffic``'s torch."""
