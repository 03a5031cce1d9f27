"""What an operation costs on a target: hardware and model profiles, the one roofline formula, the terms
of an iteration, tensor/pipeline-parallel communication, CUDA graphs, host and front-end time.

Imports only ``sim.base.errors`` / ``sim.base.options`` (the layer order is drawn in docs/design.md).
"""
