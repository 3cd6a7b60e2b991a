"""Experiment configs: the typed schema, loading and overrides, cross-key rules, key suggestions, the safe YAML
reader, and the built-in configs (builtin/)."""
