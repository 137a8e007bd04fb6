"""Format layer: what a checkpoint is on storage, independent of Paddle and of the backend.

Four floors, one folder each (imports go down the list; ``tests/integration/test_layers.py`` holds it):

* here, the on-disk formats: :mod:`.layout` (names, paths, byte offsets), :mod:`.manifest` (one
  checkpoint's manifest), :mod:`.global_manifest` (``global.json``, the commit of several ranks),
  :mod:`.rng_schema` and :mod:`.objstate` (what a manifest records of RNGs and the script's own state),
  :mod:`.save_plan` (``plan.json``) and :mod:`.metrics_record` (one line of the metrics log): documents,
  their validation as untrusted input, nothing that moves bytes;
* :mod:`paddle_acp.format.engine`: moving bytes (host buffers, snapshots, streaming, CRC, the writer and
  THE reader that restore and every tool verify through, spread writes' shares);
* :mod:`paddle_acp.format.commit`: making checkpoints visible and taking them away (atomic commit, rank 0's
  global commit and its thread, absences, verdict marks, writer fencing, retention);
* :mod:`paddle_acp.format.checkpoints`: the checkpoints of a range (the checkpointers of one and of several
  ranks, the index in restart order, the restart's choice, the global reader, the node-local cache, the
  metrics log).

Raw file I/O is :mod:`paddle_acp.storage`'s; this layer reaches storage only through its interface.
"""
