"""The ``paddle-acp`` console script.

It lives outside the ``paddle_acp`` package on purpose: importing ``paddle_acp`` runs the Paddle
version gate (it imports Paddle, about 2 s) and installs the Executor.run hook, which the operator
tools (``ls``, ``inspect``, ``verify``, ``gc``, ``stats``, ``export``, every ``--help``) never need.
This module is imported first and sets :data:`DEFER_PADDLE`, which the package reads: the gate then
runs only when ``paddle-acp run`` (or a public name that needs Paddle) asks for it. ``import
paddle_acp`` anywhere else gates and hooks as before.
"""

import sys
from typing import List, Optional

#: Read by ``paddle_acp/__init__.py``: defer the version gate and the hook in this process.
DEFER_PADDLE = True


def main(argv: Optional[List[str]] = None) -> int:
    from paddle_acp.cli import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":  # ``python -m paddle_acp_cli``: the marker must be found under this name
    sys.modules.setdefault("paddle_acp_cli", sys.modules[__name__])
    sys.exit(main())
