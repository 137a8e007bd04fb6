#!/usr/bin/env python
"""Load a ``paddle-acp export`` with plain Paddle (paddle_acp is never imported).

Builds, in a fresh process, the same program as ``train_script.py`` (program
0: ``m0_fc1.w`` ... with Adam + StepDecay), runs its startup program and then
loads the exported files into it two ways, each in its own fresh scope:

* ``paddle.static.set_program_state(main, paddle.load(PREFIX.pdparams, return_numpy=True))``
  -> ``OUT/set_program_state.npz`` (every persistable of the scope);
* ``paddle.static.load(main, PREFIX)`` (needs ``PREFIX.pdopt`` too)
  -> ``OUT/static_load.npz``.

Usage: tools_load_export.py --prefix DIR/model --out DIR [--static-load]
"""
import argparse
import os
import sys

import numpy as np
import paddle

IN_DIM, HIDDEN = 16, 32


def build():
    """Program 0 of train_script.py, built the same way (same variable names)."""
    main, startup = paddle.static.Program(), paddle.static.Program()
    names = ["m0_" + n for n in ("fc1.w", "fc1.b", "fc2.w", "fc2.b")]
    with paddle.static.program_guard(main, startup):
        x = paddle.static.data("m0_x", [None, IN_DIM], "float32")
        y = paddle.static.data("m0_y", [None, 1], "float32")
        h = paddle.static.nn.fc(x, HIDDEN, weight_attr=paddle.ParamAttr(name=names[0]),
                                bias_attr=paddle.ParamAttr(name=names[1]))
        h = paddle.nn.functional.relu(h)
        h = paddle.nn.functional.dropout(h, p=0.3, training=True)
        pred = paddle.static.nn.fc(h, 1, weight_attr=paddle.ParamAttr(name=names[2]),
                                   bias_attr=paddle.ParamAttr(name=names[3]))
        loss = paddle.mean(paddle.square(pred - y))
        sched = paddle.optimizer.lr.StepDecay(learning_rate=0.01, step_size=2, gamma=0.5)
        paddle.optimizer.Adam(learning_rate=sched).minimize(loss)
    return main, startup


def dump(scope, path):
    out = {}
    for name in scope.local_var_names():
        var = scope.find_var(name)
        try:
            t = var.get_tensor()
        except Exception:
            continue
        if t._is_initialized():
            out[name] = np.array(t)
    np.savez(path, **out)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--prefix", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--static-load", action="store_true")
    args = p.parse_args()
    paddle.enable_static()
    paddle.seed(12345)  # not the training seed: the startup values differ from the trained ones
    main_prog, startup = build()
    exe = paddle.static.Executor(paddle.CPUPlace())

    scope = paddle.static.Scope()
    with paddle.static.scope_guard(scope):
        exe.run(startup)
        state = paddle.load(args.prefix + ".pdparams", return_numpy=True)
        paddle.static.set_program_state(main_prog, state)
        dump(scope, os.path.join(args.out, "set_program_state.npz"))

    if args.static_load:
        scope = paddle.static.Scope()
        with paddle.static.scope_guard(scope):
            exe.run(startup)
            paddle.static.load(main_prog, args.prefix)
            dump(scope, os.path.join(args.out, "static_load.npz"))

    assert "paddle_acp" not in sys.modules, "paddle_acp was imported"
    print("loaded", sorted(state))


if __name__ == "__main__":
    main()
