"""Paddle's own auto-checkpoint tests (unittest files, Apache-2.0, from Paddle's repository).

They are not collected here: ``tests/e2e/test_paddle_ported.py`` runs each file as Paddle's CI did, a
process of its own, under ``python -m paddle_acp run``.
"""

collect_ignore_glob = ["test_*.py"]
