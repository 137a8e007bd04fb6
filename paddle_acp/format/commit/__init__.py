"""Commit, fencing and retention: how a checkpoint becomes visible whole, who may write, what is deleted.

:mod:`.atomic` (commit strategies), :mod:`.part_commit` and :mod:`.committer` (rank 0's global commit and its
thread), :mod:`.absence`, :mod:`.verdict`, :mod:`.fencing` and :mod:`.retention`. Never imports
:mod:`paddle_acp.format.checkpoints`.
"""
