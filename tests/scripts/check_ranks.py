"""A two-rank job for ``paddle-acp check`` (tests/e2e/test_check.py): starts check_script.py (its arguments
passed on) as ranks 0 and 1 of one job (PADDLE_TRAINER_ID, PADDLE_TRAINERS_NUM=2; each rank seeds by
its id, so the ranks hold different state: PADDLE_ACP_RANK_STATE=per-rank) and exits with 0 only when both did."""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "check_script.py")] + sys.argv[1:],
                          env={**os.environ, "PADDLE_TRAINER_ID": str(k), "PADDLE_TRAINERS_NUM": "2",
                               "PADDLE_ACP_RANK_STATE": "per-rank"})
         for k in range(2)]
codes = [p.wait() for p in procs]
sys.exit(0 if all(c == 0 for c in codes) else 1)
