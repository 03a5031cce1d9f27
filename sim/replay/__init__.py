"""A trace replayed on a target: the session (loaded traces, memo), the one target resolver, run
configurations, the simulation modes (isolated, serving, token, tree) and their records and summaries.
Imports ``sim.serving`` and below.
"""
