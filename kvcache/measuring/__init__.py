"""The measuring wing: imports torch and transformers. Release differences (compat),
geometry (geometry), configs (configs) and building (models),
devices, copy bandwidth, the cache registry and its fixed classes, the decode step, counted traffic, the
attention probe and the session that drives them, producing plain records for the analysing wing."""
