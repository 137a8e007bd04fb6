"""The engine: moving a checkpoint's bytes between host memory and storage, verified.

Host buffers, snapshots, streamed saves, CRC threads, the writer, THE reader (the one place a checkpoint is read and
verified) and spread writes' shares. It imports the on-disk formats and, for the writer's target,
:mod:`paddle_acp.format.commit.atomic`; never :mod:`paddle_acp.format.checkpoints`."""
