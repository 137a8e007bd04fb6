#!/usr/bin/env python
"""Build programs with Paddle's own static parallel APIs (they build on a CPU; running
them needs NCCL) and print, as one JSON line, what paddle-acp's auto mode decides.

Needs PADDLE_TRAINER_ID / PADDLE_TRAINERS_NUM / PADDLE_TRAINER_ENDPOINTS /
PADDLE_CURRENT_ENDPOINT for ``fleet.init``.
"""
import json

import paddle

paddle.enable_static()
from paddle.distributed import fleet  # noqa: E402
from paddle.distributed.fleet.layers.mpu import mp_ops  # noqa: E402

from paddle_acp.adapter.fleet import decide_mode, fleet_degrees  # noqa: E402
from paddle_acp.adapter.programs import program_info  # noqa: E402

PIR = bool(paddle.framework.in_pir_mode())


class Entry:
    def __init__(self, program):
        self.info = program_info(program)
        self.key = self.info.fingerprint


def describe(build, setting="auto"):
    main, start = paddle.static.Program(), paddle.static.Program()
    try:
        with paddle.static.program_guard(main, start):
            build()
    except Exception as exc:  # reported: the test decides what must build
        return {"error": "%s: %s" % (type(exc).__name__, str(exc)[:200])}
    e = Entry(main)
    return {"mode": decide_mode(setting, [e])[0], "ops": list(e.info.parallel_ops), "training": e.info.is_training}


def plain():
    x = paddle.static.data("x", [None, 8], "float32")
    loss = paddle.mean(paddle.static.nn.fc(x, 4))
    paddle.optimizer.Adam(0.01).minimize(loss)


def tensor_parallel():
    # the ops ColumnParallelLinear / RowParallelLinear insert (fleet/layers/mpu/mp_ops.py)
    x = paddle.static.data("x", [None, 8], "float32")
    x.stop_gradient = False
    h = mp_ops._c_identity(x, group=None)
    y = mp_ops._mp_allreduce(paddle.nn.Linear(8, 8)(h), group=None)
    paddle.optimizer.SGD(0.1).minimize(paddle.mean(y))


def split_linear():
    x = paddle.static.data("x", [None, 8], "float32")
    y = paddle.distributed.split(x, (8, 8), operation="linear", axis=1, num_partitions=2)
    paddle.optimizer.SGD(0.1).minimize(paddle.mean(y))


def split_embedding():
    x = paddle.static.data("x", [None, 8], "int64")
    y = paddle.distributed.split(x, (16, 8), operation="embedding", num_partitions=2)
    paddle.optimizer.SGD(0.1).minimize(paddle.mean(y))


out = {"plain": describe(plain)}  # before fleet.init: nothing says per-rank
strategy = fleet.DistributedStrategy()
strategy.tensor_parallel = True
strategy.tensor_parallel_configs = {"tensor_parallel_degree": 2}
strategy.hybrid_configs = {"dp_degree": 1, "mp_degree": 2, "pp_degree": 1}
fleet.init(is_collective=True, strategy=strategy)
out["tensor_parallel"] = describe(tensor_parallel)
out["split_linear"] = describe(split_linear)
out["split_embedding"] = describe(split_embedding)
out["explicit_replicated"] = describe(tensor_parallel, "replicated")
fleet_entry = describe(plain)
fleet_entry["degrees"] = fleet_degrees()
out["fleet_hybrid"] = fleet_entry
print(json.dumps(out))
