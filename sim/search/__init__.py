"""Many runs: grids, sweeps (local or Dask), tuning, Pareto frontiers, the deployment planner and the
knee of the latency-rate curve. Drives ``sim.api`` and the layers below it.
"""
