"""The engine: moving a checkpoint's bytes between host memory and storage, verified.

:mod:`.arena` (page-aligned host buffers, parallel copies), :mod:`.snapshot` (a checkpoint's content,
copied out of Paddle, and its layout), :mod:`.stream` (a state over the host-memory budget, in chunks),
:mod:`.crc` (the CRC threads, joining checksums of pieces), :mod:`.writer` (one checkpoint's data file and manifest, into a directory
being committed), :mod:`.reader` (THE reader: the one place a checkpoint is read and verified),
:mod:`.loaded` (a verified checkpoint, its tensors handed out once each), :mod:`.spool` (the local spool
of a remote restore over the budget) and :mod:`.shares` (spread writes: which rank writes which tensor,
and reading the shares back). It imports the on-disk formats and, for the writer's target,
:mod:`paddle_acp.format.commit.atomic`; never :mod:`paddle_acp.format.checkpoints`.
"""
