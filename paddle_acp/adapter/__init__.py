"""Adapter layer: the only code that touches Paddle's internals.

Programs, tensors and places, RNG generators, the version gate, the executor, fleet, the store, elastic
launchers and the DataLoader's worker start.
"""
