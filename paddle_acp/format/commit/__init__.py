"""Commit, fencing and retention: how a checkpoint becomes visible whole, who may write, what is deleted.

:mod:`.atomic` (the commit strategies: rename of a temporary directory, or manifest last),
:mod:`.part_commit` (rank 0's global commit of the parts of several ranks) and :mod:`.committer` (its
thread, in position order), :mod:`.absence` (a rank's ``absent-rank-<k>`` word that it has no part),
:mod:`.verdict` (the marks that condemn one copy, the same on every rank), :mod:`.fencing` (a
generation per start of every rank; an older writer stops) and :mod:`.retention` (which checkpoints to
keep, and the one way to delete one). It imports the on-disk formats and the engine; never
:mod:`paddle_acp.format.checkpoints`.
"""
