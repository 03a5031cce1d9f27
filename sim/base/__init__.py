"""The floor every layer of sim/ stands on: its errors (errors) and its declared options (options)."""
