"""Adapter layer: the only code that touches Paddle's internals.

Programs (which are training programs, their state, fingerprints), tensors and places,
RNG generators, the LR scheduler, the supported-version gate and the DataLoader's worker start.
"""
