"""Adapter layer: the only code that touches Paddle's internals.

Programs (which are training programs, their state, fingerprints), tensors and places,
RNG generators, the LR scheduler and the supported-version gate.
"""
