"""The checkpoints of a range: the objects that save, list and restore them, built on the floors below.

:mod:`.multirank` (the one writer, for every world size), :mod:`.part_reader` (one writer's directory),
:mod:`.index` (the order a restart and every tool try checkpoints in), :mod:`.restart` (what a range resumes
from), :mod:`.global_reader` (what all read of a checkpoint of several ranks), :mod:`.cache` and
:mod:`.cache_trust` (the node-local tier) and :mod:`.metrics_log` (the metrics file).
"""
