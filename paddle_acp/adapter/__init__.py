"""Adapter layer: the only code that touches Paddle's internals.

Programs, tensors and places, RNG, the version gate, the executor, fleet, the store, elastic launchers, loader workers.
"""
