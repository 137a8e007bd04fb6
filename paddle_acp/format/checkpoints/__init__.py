"""The checkpoints of a range: the objects that save, list and restore them, built on the floors below.

:mod:`.multirank` (the one writer, for every world size: every rank's part, one global commit),
:mod:`.part_reader` (reads one writer's directory: a rank's part, an earlier release's ``ckpt-N``), :mod:`.index` (both layouts in the order a restart tries them: the restart and every
tool pick through it), :mod:`.restart` (the checkpoint a range resumes from; ``NoUsableCheckpointError``),
:mod:`.global_reader` (what every rank and tool reads of a checkpoint of several ranks), :mod:`.cache`
and :mod:`.cache_trust` (the node-local tier) and :mod:`.metrics_log` (the metrics file: one line per
save, buffered and written; its record type is :mod:`paddle_acp.format.metrics_record`).
"""
