"""The job runtime, in parts: the runtime facade (runtime), the claim loop (producer), the
execution of one run (executor), the completer that batches every settle, the heartbeater, the
queue-depth sampler (depth), and the per-run state (state)."""
