"""Helpers every layer shares: files written whole and read safely, user paths, .npz headers, host memory, the
console."""
