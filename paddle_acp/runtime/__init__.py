"""Runtime layer: the training-process side of paddle-acp.

:mod:`~paddle_acp.runtime.api` holds the public loop functions; :mod:`~paddle_acp.runtime.range` one loop
(:class:`~paddle_acp.runtime.range.EpochRange`), composed of collaborators that own their state (each module's
docstring says what it owns); :mod:`~paddle_acp.runtime.state` what the process remembers between ranges;
:mod:`~paddle_acp.runtime.hook` the ``Executor.run`` patch that feeds programs to the active range.
"""
