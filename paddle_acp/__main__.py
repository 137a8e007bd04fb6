"""``python -m paddle_acp``: the command line."""

import sys

from paddle_acp.cli import main

if __name__ == "__main__":
    sys.exit(main())
