"""How the tests choose the ranks' coordination: through a store (``PADDLE_MASTER`` on a free port, as
``paddle.distributed.launch`` sets it) or through storage alone (paddle_acp.runtime.coord)."""
import socket

COORDINATIONS = ("storage", "store")


def free_port():
    """A TCP port free now on 127.0.0.1 (rank 0's store binds it moments later)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def coord_env(mode):
    """The variables of one start of a job coordinated by ``mode`` (a new store port for each start, as a
    launcher gives one)."""
    if mode == "store":
        return {"PADDLE_ACP_COORDINATION": "store", "PADDLE_MASTER": f"127.0.0.1:{free_port()}"}
    return {"PADDLE_ACP_COORDINATION": "storage"}
