"""How the tests choose the ranks' coordination: through a store (``PADDLE_MASTER`` on a free port, as
``paddle.distributed.launch`` sets it) or through storage alone (paddle_acp.runtime.coord)."""
from support.servers import free_ports

COORDINATIONS = ("storage", "store", "launch")


def free_port():
    """A TCP port free now on 127.0.0.1 (rank 0's store binds it moments later), below the ephemeral range."""
    return free_ports(1)[0]


def coord_env(mode):
    """The variables of one start of a job coordinated by ``mode`` (a new store port for each start, as a
    launcher gives one): ``store``: MASTER_ADDR/MASTER_PORT, a store of paddle-acp's own, which ``auto`` (the
    default) picks; ``launch``: PADDLE_MASTER as paddle.distributed.launch sets it, the job's own store shared
    (PADDLE_ACP_COORDINATION=store: auto keeps to storage there); ``storage``: storage only."""
    if mode == "store":
        return {"PADDLE_ACP_COORDINATION": "auto", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    if mode == "launch":
        return {"PADDLE_ACP_COORDINATION": "store", "PADDLE_MASTER": f"127.0.0.1:{free_port()}"}
    return {"PADDLE_ACP_COORDINATION": "storage"}
