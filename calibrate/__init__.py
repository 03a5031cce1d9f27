"""rksim calibrate."""
