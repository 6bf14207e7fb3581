"""The job runtime, in parts: the runtime facade and its loop (runtime), the completer that
batches settles, the heartbeater, the queue-depth sampler, and the per-run state."""
