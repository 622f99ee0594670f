"""One module per ``kvcache`` command (:data:`kvcache.cli.COMMANDS`): ``kvcache X`` runs ``kvcache.commands.X.main``.
A command module holds the command's arguments, its output and its exit status; what it does lives in a wing
(:mod:`kvcache.analysing`, :mod:`kvcache.measuring`) or in the command's own package (:mod:`kvcache.ab`,
:mod:`kvcache.bisect`, :mod:`kvcache.sentinel`). Nothing is imported here: ``kvcache compare`` must not pay for
``kvcache traffic``'s torch."""
