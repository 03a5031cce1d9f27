"""The serving engine: vLLM V1's scheduler, the block pool and prefix cache, KV sharing, the KV budget,
the simpy engine, routers, replicas, goodput and serving metrics. Imports ``sim.cost`` and ``sim.workload``.
"""
