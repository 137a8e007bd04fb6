"""PADDLE_ACP_PREEMPT_SIGNALS with real processes and real signals: SIGINT named there saves, fault signals are
refused, a blank value says that preemption saves are off."""

import os
import signal
import subprocess
import sys
import textwrap

from support.stop_at import act_at_step, start
from test_steps import assert_same, reference, steps


def signal_at_step(out, ck, env_extra, sig):
    """Run the steps script; at epoch 1 step 3 send ``sig`` to it from outside; its status and stderr."""
    rc, err, _ = act_at_step(out, ck, lambda p: os.kill(p.pid, sig), env=env_extra)
    return rc, err


def test_sigint_named_as_a_preemption_signal_saves_exits_130_and_resumes(tmp_path, tmp_path_factory):
    """Before: the handler chained to Python's SIGINT handler: KeyboardInterrupt at once, no save, status -2."""
    ref = reference(tmp_path_factory, "pir")
    out, ck = tmp_path / "out", tmp_path / "ck"
    rc, err = signal_at_step(out, ck, {"PADDLE_ACP_PREEMPT_SIGNALS": "SIGINT,SIGTERM"}, signal.SIGINT)
    assert rc == 128 + signal.SIGINT, err[-3000:]
    assert "KeyboardInterrupt" not in err
    assert "received SIGINT" in err
    assert "saved checkpoint ckpt-e1-s4 (epoch 1 step 4)" in err
    assert steps(out)[1][-1][0] == (1, 3)
    p = start(out, ck)
    o, e = p.communicate(timeout=120)
    assert p.returncode == 0, e[-3000:]
    assert "resumed at epoch 1 step 4" in o
    assert_same(out, ref)


def test_sigint_preemption_still_calls_the_scripts_own_sigint_handler(tmp_path):
    code = textwrap.dedent("""
        import os, signal
        import paddle_acp as acp
        seen = []
        signal.signal(signal.SIGINT, lambda s, f: seen.append(s))
        for epoch in acp.train_epoch_range(3, 0):
            if epoch == 1:
                os.kill(os.getpid(), signal.SIGINT)
        print("seen", seen, flush=True)
    """)
    env = dict(os.environ, PADDLE_ACP_CHECKPOINT_URI=str(tmp_path / "ck"), PADDLE_ACP_PREEMPT_SIGNALS="INT",
               PADDLE_ACP_EXIT_ON_PREEMPT="0")
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "seen [2]" in p.stdout
    assert "preempted by signal 2 at epoch 1" in p.stderr


SEGFAULT = textwrap.dedent("""
    import ctypes
    import paddle_acp as acp
    for epoch in acp.train_epoch_range(3, 0):
        if epoch == 1:
            ctypes.string_at(0)  # a real segmentation fault
""")


def test_fault_signals_are_refused_as_preemption_signals_and_a_segfault_still_crashes(tmp_path):
    """Before: PADDLE_ACP_PREEMPT_SIGNALS=SIGSEGV was accepted and a segfault then spun forever (the handler
    returned to the faulting instruction)."""
    env = dict(os.environ, PADDLE_ACP_CHECKPOINT_URI=str(tmp_path / "ck"))
    for value, name in (("SIGSEGV", "SIGSEGV"), ("TERM,bus", "SIGBUS"), ("FPE", "SIGFPE"), ("SIGILL", "SIGILL"),
                        ("SIGABRT", "SIGABRT"), ("KILL", "SIGKILL"), ("SIGSTOP", "SIGSTOP")):
        p = subprocess.run([sys.executable, "-c", SEGFAULT], env=dict(env, PADDLE_ACP_PREEMPT_SIGNALS=value),
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 1, (value, p.returncode, p.stderr[-2000:])
        assert "ConfigError" in p.stderr and f"PADDLE_ACP_PREEMPT_SIGNALS={value!r}: {name}" in p.stderr
    p = subprocess.run([sys.executable, "-c", SEGFAULT], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == -signal.SIGSEGV  # the default preemption signals leave a segfault a crash


def test_blank_preempt_signals_mean_none_and_the_start_line_says_so(tmp_path):
    """Before: ' ' switched the SIGTERM saves off and nothing said so."""
    out, ck = tmp_path / "out", tmp_path / "ck"
    rc, err = signal_at_step(out, ck, {"PADDLE_ACP_PREEMPT_SIGNALS": "  "}, signal.SIGTERM)
    assert rc == -signal.SIGTERM, err[-3000:]
    assert "preemption saves are off (PADDLE_ACP_PREEMPT_SIGNALS is empty" in err
    assert "received SIGTERM" not in err
    out2, ck2 = tmp_path / "out2", tmp_path / "ck2"
    rc, err = signal_at_step(out2, ck2, {}, signal.SIGTERM)
    assert rc == 143 and "preemption saves are off" not in err
