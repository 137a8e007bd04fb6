"""Compatibility layer: Paddle's own ``auto_checkpoint`` and ``checkpoint_saver`` surfaces.

Importable at their historical paths too (``paddle_acp.auto_checkpoint``, ``paddle_acp.checkpoint_saver``).
"""
