"""How the ranks of a job coordinate: one small interface, through the job's store or through storage alone.

A :class:`Coordinator` serves one range of one rank. Its verbs:

* :meth:`~Coordinator.post` / :meth:`~Coordinator.latest`: rank 0 posts a decision under a key, every rank
  reads the newest one (the save plan, :mod:`paddle_acp.runtime.agree`);
* :meth:`~Coordinator.arrive` / :meth:`~Coordinator.arrivals`: a rank says it reached a point (its part of a
  checkpoint is in place), rank 0 counts who did (its commit looks at storage once all did, instead of
  polling it: :mod:`paddle_acp.format.commit.part_commit`); None where only storage can tell;
* :meth:`~Coordinator.check`: the liveness signal: raises :class:`CoordinationError` on a rank that lost the
  job's store (it lives in rank 0's process: a rank 0 that died takes it down), so that rank stops at its
  next due point with a clear error instead of training on without checkpoints.

Three implementations, chosen at the range's open by :func:`open_coordinator` from
``PADDLE_ACP_COORDINATION`` (the same on every rank: the environment decides, never a rank's luck):

* :class:`~paddle_acp.runtime.coord.etcd.EtcdCoordinator`: the etcd server of Paddle's elastic launcher
  (``auto`` under a launcher with ``--master etcd://...`` or ``PADDLE_ELASTIC_SERVER``; ``etcd``: that, or an
  error): a server outside every rank, with rank 0's liveness on a lease (:mod:`~paddle_acp.runtime.coord.etcd`);
* :class:`~paddle_acp.runtime.coord.store.StoreCoordinator`: Paddle's TCP store (``auto``: a store of ours at
  ``MASTER_ADDR``/``MASTER_PORT``; ``store``: that, or the job's own that ``paddle.distributed.launch`` names in
  ``PADDLE_MASTER``, which Paddle opens holding the GIL: :mod:`paddle_acp.adapter.store`, docs/design.md). Per checkpoint nothing but the ranks' parts and rank 0's
  ``global.json`` goes to storage; every call is bounded, and the first failure ends the store for this
  process (said once);
* :class:`~paddle_acp.runtime.coord.files.StorageCoordinator`: small files on the checkpoint storage (the save
  plan's ``plan.json``), the protocol of earlier versions, kept as the fallback.

What must survive a restart (the job's generation, what was committed) stays on storage in both.
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
    """The coordinator of range ``range_name`` (``range_dir`` on ``storage``) on this rank, chosen by
    ``PADDLE_ACP_COORDINATION`` (module docstring). ConfigError for ``store`` in a job without a store, ``etcd``
    outside an elastic launcher with one."""
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
        # the job's own store: Paddle 3.3.1 opens it holding the GIL until every rank connected (no thread of
        # this process runs meanwhile, unbounded but for FLAGS_stop_check_timeout): only when asked for
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
