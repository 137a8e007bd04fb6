"""Historical import path of :mod:`paddle_acp.compat.checkpoint_saver` (the same module object)."""

import sys as _sys

from paddle_acp.compat import checkpoint_saver as _impl

_sys.modules[__name__] = _impl
