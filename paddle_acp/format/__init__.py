"""Format layer: what a checkpoint is on storage, independent of Paddle and of the backend.

Four floors, one folder each (imports go down the list; ``tests/integration/test_layers.py`` holds it): here the on-disk
documents and their validation as untrusted input (nothing that moves bytes); :mod:`.engine` moves bytes (snapshots,
streaming, CRC, the writer and THE reader); :mod:`.commit` makes checkpoints visible and takes them away;
:mod:`.checkpoints` holds the checkpoints of a range. Raw file I/O is :mod:`paddle_acp.storage`'s; this layer reaches
storage only through its interface."""
