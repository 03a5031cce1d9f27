"""Plain serving workloads shaped like ``vllm bench`` (serve, throughput) and the published-figure
validation. Drives the engine through ``sim.replay`` and below.
"""
