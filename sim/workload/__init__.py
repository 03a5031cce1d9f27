"""What a trace asks for: its features, the decisions a policy makes on them, the reshaped jobs and the
workload configuration. Imports only ``sim.base.errors`` / ``sim.base.options``.
"""
