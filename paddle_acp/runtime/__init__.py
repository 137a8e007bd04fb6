"""Runtime layer: the training-process side of paddle-acp.

The ``Executor.run`` hook, epoch ranges, the registry of training programs, the background
saver and preemption signals.
"""
