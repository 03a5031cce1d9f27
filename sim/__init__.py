"""rksim sim."""
