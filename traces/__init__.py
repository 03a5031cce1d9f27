"""rksim traces."""
