"""How the ranks of a job coordinate: one small interface, through the job's store or through storage alone.

A :class:`Coordinator` serves one range of one rank:

* ``post`` / ``latest``: rank 0 posts a decision under a key, every rank reads the newest (the save plan,
  :mod:`paddle_acp.runtime.agree`);
* ``arrive`` / ``arrivals``: a rank says it reached a point; rank 0 counts who did, so its commit looks at storage
  once instead of polling it (:mod:`paddle_acp.format.commit.part_commit`); None where only storage can tell;
* ``check``: raises :class:`CoordinationError` on a rank that lost the job's store (it lives in rank 0's process),
  so that rank stops at its next due point instead of training on without checkpoints.

:func:`open_coordinator` picks one from ``PADDLE_ACP_COORDINATION`` (the same on every rank, never a rank's luck):

* :class:`~paddle_acp.runtime.coord.etcd.EtcdCoordinator`: the etcd server of Paddle's elastic launcher, outside
  every rank (``auto`` under ``--master etcd://...`` or ``PADDLE_ELASTIC_SERVER``; ``etcd``: that, or an error);
* :class:`~paddle_acp.runtime.coord.store.StoreCoordinator`: Paddle's TCP store (``auto``: ours at
  ``MASTER_ADDR``/``MASTER_PORT``; ``store``: also the job's own named in ``PADDLE_MASTER``, which Paddle opens
  holding the GIL: :mod:`paddle_acp.adapter.store`, docs/design.md); storage then gets only the parts and rank 0's
  ``global.json``; every call is bounded, and the first failure ends the store for this process;
* :class:`~paddle_acp.runtime.coord.files.StorageCoordinator`: small files on the checkpoint storage, the fallback.

What must survive a restart (the job's generation, what was committed) always stays on storage.
"""

from __future__ import annotations

import logging
from typing import Mapping, Optional

from paddle_acp.adapter.elastic import elastic_etcd, incarnation
from paddle_acp.adapter.store import job_store_endpoint
from paddle_acp.config import CheckpointConfig
from paddle_acp.config.components import coordination_from_env, store_env_from_env
from paddle_acp.errors import ConfigError
from paddle_acp.runtime.coord.base import CoordinationError, Coordinator
from paddle_acp.runtime.coord.etcd import EtcdCoordinator
from paddle_acp.runtime.coord.etcd import link_for as etcd_link_for
from paddle_acp.runtime.coord.files import StorageCoordinator
from paddle_acp.runtime.coord.store import StoreCoordinator, link_for
from paddle_acp.storage.base import Storage

__all__ = ["CoordinationError", "Coordinator", "EtcdCoordinator", "StorageCoordinator", "StoreCoordinator",
           "open_coordinator"]

logger = logging.getLogger("paddle_acp")


def open_coordinator(cfg: CheckpointConfig, storage: Storage, range_dir: str, range_name: str,
                     env: Optional[Mapping[str, str]] = None) -> Coordinator:
    """This rank's coordinator of range ``range_name`` (``range_dir`` on ``storage``). ConfigError for ``store`` in
    a job without a store, or ``etcd`` outside an elastic launcher with one."""
    mode = coordination_from_env(env)
    store_env = store_env_from_env(env)
    server = elastic_etcd(store_env) if mode in ("auto", "etcd") else None
    if mode == "etcd" and server is None:
        raise ConfigError("PADDLE_ACP_COORDINATION=etcd, but this process runs under no elastic launcher with an etcd "
                          "server (python -m paddle.distributed.launch --master etcd://HOST:PORT): set "
                          "PADDLE_ELASTIC_SERVER=HOST:PORT, or use PADDLE_ACP_COORDINATION=auto")
    if server is not None:
        try:
            elink = etcd_link_for(server.endpoint, cfg.trainer_id, cfg.part_timeout)
        except ValueError as exc:
            raise ConfigError(f"the etcd server named by {server.source}: {exc}") from None
        logger.info("range %s: the ranks coordinate through %s, named by %s (PADDLE_ACP_COORDINATION=%s)",
                    range_name, elink.client, server.source, mode)
        return EtcdCoordinator(elink, f"{cfg.job_id}/{range_name}/{incarnation(store_env) or '-'}")
    ep = job_store_endpoint(store_env) if mode != "storage" else None
    if mode == "store" and ep is None:
        raise ConfigError("PADDLE_ACP_COORDINATION=store, but the job names no store: set PADDLE_MASTER (as "
                          "python -m paddle.distributed.launch does) or MASTER_ADDR and MASTER_PORT, or use "
                          "PADDLE_ACP_COORDINATION=auto")
    if ep is not None and mode == "auto" and ep.source == "PADDLE_MASTER":
        # the job's own store: Paddle 3.3.1 opens it holding the GIL until every rank connected (unbounded but
        # for FLAGS_stop_check_timeout), so only when asked for
        logger.info("range %s: the ranks coordinate through storage (PADDLE_ACP_COORDINATION=store: through the job's "
                    "store at %s, whose open stops this process until every rank connected)", range_name, ep)
        ep = None
    if ep is None:
        return StorageCoordinator(storage, range_dir)
    if ep.shared_with_trainer:
        logger.warning("range %s: PADDLE_MASTER %s is rank 0's own trainer endpoint (launch --ips/--start_port), which "
                       "the job's collectives may bind too: set PADDLE_ACP_COORDINATION=storage if they fail to",
                       range_name, ep)
    link = link_for(ep, cfg.trainer_id, cfg.world_size or 1, open_timeout=cfg.part_timeout)
    logger.info("range %s: the ranks coordinate through the job's store at %s (PADDLE_ACP_COORDINATION=%s)",
                range_name, ep, mode)
    return StoreCoordinator(link, f"{cfg.job_id}/{range_name}")
