"""Runtime layer: the training-process side of paddle-acp.

- :mod:`~paddle_acp.runtime.epoch_range`: the public loop functions (``train_epoch_range``,
  ``resumable``, ``active_range``, ``reset``).
- :mod:`~paddle_acp.runtime.range`: :class:`EpochRange`, one loop: opening (all its I/O), epochs,
  the programs the hook feeds it; its parts :mod:`~paddle_acp.runtime.steps` (mid-epoch steps),
  :mod:`~paddle_acp.runtime.persist` (taking and persisting a checkpoint) and
  :mod:`~paddle_acp.runtime.restore` (choosing the checkpoint and writing it back).
- :mod:`~paddle_acp.runtime.state`: what the process remembers between ranges (one object, ``STATE``).
- :mod:`~paddle_acp.runtime.hook` (the ``Executor.run`` patch), :mod:`~paddle_acp.runtime.registry`
  (the training programs of a range), :mod:`~paddle_acp.runtime.saver` (the background writer and the
  busy policy), :mod:`~paddle_acp.runtime.preemption` (signals), :mod:`~paddle_acp.runtime.budget`
  (the host-memory budget of the snapshot buffers), :mod:`~paddle_acp.runtime.digests` (the per-epoch
  digests ``paddle-acp check`` compares).
"""
