"""Historical import path of :mod:`paddle_acp.compat.auto_checkpoint` (the same module object)."""

import sys as _sys

from paddle_acp.compat import auto_checkpoint as _impl

_sys.modules[__name__] = _impl
