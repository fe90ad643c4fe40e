"""The decode loop and what it runs on: the engine, KV caches, statistics, text, draft length, SpecGuard's step loop."""
