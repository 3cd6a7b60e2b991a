"""Run folders: their creation and names, the lock that keeps one process in each, and the records a run writes
(TensorBoard events, metrics.jsonl)."""
