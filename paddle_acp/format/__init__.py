"""Format layer: what a checkpoint is on storage, independent of Paddle and of the backend.

Layout and names, the manifest (and the global manifest of a multi-rank checkpoint), the
commit strategies, the writer, the one reader/verifier that restore and every tool use,
writer fencing and the metrics log.
"""
