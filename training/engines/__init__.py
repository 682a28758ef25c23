"""One module per engine; each exposes run(spec, prepared, stats, watcher) -> this process's rank."""
