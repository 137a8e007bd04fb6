"""Runtime layer: the training-process side of paddle-acp.

- :mod:`~paddle_acp.runtime.api`: the public loop functions (``train_epoch_range``,
  ``resumable``, ``active_range``, ``reset``).
- :mod:`~paddle_acp.runtime.range`: :class:`EpochRange`, one loop: opening (all its I/O, in
  :mod:`~paddle_acp.runtime.opening`), epochs, the programs the hook feeds it. It composes collaborators that own their state:
  :mod:`~paddle_acp.runtime.restore` (the checkpoint resumed from, written back),
  :mod:`~paddle_acp.runtime.steps` (the loop's position, mid-epoch steps),
  :mod:`~paddle_acp.runtime.save_decision` (when a checkpoint is due and what it does: one pure policy),
  :mod:`~paddle_acp.runtime.schedule` (the facts it decides on: the clock, the ``auto`` budget, the ranks' plan),
  :mod:`~paddle_acp.runtime.buffers` (the snapshot buffers, the host-memory budget) and
  :mod:`~paddle_acp.runtime.persist` (taking a checkpoint; :mod:`~paddle_acp.runtime.rank_writes`: which tensors
  this rank writes; :mod:`~paddle_acp.runtime.ticket_writer`: persisting it on the saver's thread, its outcome).
- :mod:`~paddle_acp.runtime.state`: what the process remembers between ranges (one object, ``STATE``).
- :mod:`~paddle_acp.runtime.hook` (the ``Executor.run`` patch), :mod:`~paddle_acp.runtime.registry`
  (the training programs of a range), :mod:`~paddle_acp.runtime.saver` (the background writer), :mod:`~paddle_acp.runtime.preemption` (signals), :mod:`~paddle_acp.runtime.shield` (the
  preemption signals in children forked during a range: DataLoader workers leave them to the training process),
  :mod:`~paddle_acp.runtime.budget`
  (the host-memory budget of the snapshot buffers), :mod:`~paddle_acp.runtime.digests` (the per-epoch
  digests ``paddle-acp check`` compares), :mod:`~paddle_acp.runtime.early` (an HDFS location opened
  in the background from the package's import, handed to the first range).
"""
