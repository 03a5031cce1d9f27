"""rksim policies."""
