"""``python -m MODULE ARGS`` for the tests, each in a fresh process forked from a warm one.

Most of a command-line test's time was the interpreter importing torch, Hydra and dp_accounting
(≈ 2.5 s of a 3.5 s refusal on the 2-core machine) and, in a run, torch._dynamo (torch.func's first
call) and Flower (a 3-round smoke run: 6.2 s cold, 1.6 s forked warm). A *zygote* — one per pytest
worker, started on first use — imports those libraries and nothing of fedpriv, then forks a child per command. The
child is a new process (its own pid, exit code, signals, file descriptors 0–2 on files, working
directory and environment as asked) that runs the module with ``runpy`` as ``-m`` does, so fedpriv
itself is imported fresh in each child, as in a real run (options registered by the tests'
``plugin_*.py`` files, e.g., are not). At its end the child does what the interpreter does at exit:
joins non-daemon threads, runs ``atexit`` handlers, flushes, exits with the code a ``SystemExit``
carried (1 and a traceback on an uncaught exception).

What a forked child cannot show is the cost or the side effects of importing those libraries; the
tests that are about what a fresh interpreter imports start one (``helpers.assert_script_runs``),
and ``FEDPRIV_TEST_FRESH=1`` sends every command to a fresh interpreter instead. A command whose
environment differs from the zygote's in a variable read at import time (thread counts, CUDA,
``PYTHON*``, ``HF_*``, ``TORCH*``, ``FLWR_*``) gets a fresh interpreter too.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# The zygote: imports the heavy libraries, then forks a child per request line on stdin and answers
# {"pid": ...} then {"status": ...} lines on stdout.
_ZYGOTE = r'''
import atexit, json, os, runpy, sys, threading, traceback
import numpy, torch, omegaconf, hydra, hydra.core.global_hydra, dp_accounting, dp_accounting.pld  # noqa
import torch._dynamo, flwr.app, flwr.common  # noqa: torch.func's first call imports dynamo (1.5 s)
def child(req):
    os.setpgid(0, 0)  # the test's timeout kills the command and whatever it started
    for fd, path, flags in ((0, req["stdin"], os.O_RDONLY), (1, req["out"], os.O_WRONLY | os.O_TRUNC),
                            (2, req["err"], os.O_WRONLY | os.O_TRUNC)):
        new = os.open(path, flags)
        os.dup2(new, fd)
        os.close(new)
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    # the interpreter puts PYTHONPATH's entries first on sys.path
    sys.path[1:1] = [p for p in req["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.argv = [req["module"], *req["args"]]
    code = 0
    try:
        runpy.run_module(req["module"], run_name="__main__", alter_sys=True)
    except SystemExit as done:
        code = done.code
    except BaseException:
        traceback.print_exc()
        code = 1
    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    try:
        threading._shutdown()
    except Exception:
        pass
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code & 0xFF)
for line in sys.stdin:
    req = json.loads(line)
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        try:
            child(req)
        finally:
            os._exit(1)
    os.write(1, (json.dumps({"pid": pid}) + "\n").encode())
    _, status = os.waitpid(pid, 0)
    os.write(1, (json.dumps({"status": os.waitstatus_to_exitcode(status)}) + "\n").encode())
'''

# variables a library reads when it is imported: a command that sets them otherwise needs a fresh interpreter
_IMPORT_TIME = ("OMP_", "MKL_", "OPENBLAS_", "CUDA_", "PYTHON", "HF_", "TORCH", "TRANSFORMERS", "NUMPY", "LD_",
                "FLWR_", "GRPC_")

_zygote: subprocess.Popen | None = None


def _import_time_env(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(_IMPORT_TIME) and k != "PYTHONPATH"}


def _start() -> subprocess.Popen:
    global _zygote
    if _zygote is None or _zygote.poll() is not None:
        _zygote = subprocess.Popen([sys.executable, "-c", _ZYGOTE], cwd=ROOT, stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, env=dict(os.environ))
    return _zygote


def _read_line(proc: subprocess.Popen, deadline: float | None) -> dict | None:
    """The zygote's next answer, or None when ``deadline`` passes first."""
    fd = proc.stdout.fileno()
    buf = b""
    while not buf.endswith(b"\n"):
        wait = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready, _, _ = select.select([fd], [], [], wait)
        if not ready:
            return None
        chunk = os.read(fd, 1)
        if not chunk:
            raise RuntimeError("the tests' warm launcher exited")
        buf += chunk
    return json.loads(buf)


def run_module(module: str, *args: str, cwd: Path | str = ROOT, env: dict[str, str] | None = None,
               timeout: float | None = None, input: str | None = None) -> subprocess.CompletedProcess:
    """``python -m module args`` with text output captured, as ``subprocess.run(..., capture_output=True,
    text=True)`` returns it (``subprocess.TimeoutExpired`` past ``timeout``, the command killed)."""
    env = dict(os.environ if env is None else env)
    argv = [sys.executable, "-m", module, *args]
    if os.environ.get("FEDPRIV_TEST_FRESH") == "1" or _import_time_env(env) != _import_time_env(dict(os.environ)):
        return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, input=input)
    with tempfile.TemporaryDirectory(prefix="fedpriv-cmd-") as tmp:
        paths = {name: os.path.join(tmp, name) for name in ("stdin", "out", "err")}
        for name, path in paths.items():
            with open(path, "w") as f:
                f.write((input or "") if name == "stdin" else "")
        zygote = _start()
        request = {"module": module, "args": list(args), "cwd": str(cwd), "env": env, **paths}
        zygote.stdin.write((json.dumps(request) + "\n").encode())
        zygote.stdin.flush()
        pid = _read_line(zygote, None)["pid"]
        answer = _read_line(zygote, None if timeout is None else time.monotonic() + timeout)
        if answer is None:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            _read_line(zygote, None)
            raise subprocess.TimeoutExpired(argv, timeout, output=Path(paths["out"]).read_text(),
                                            stderr=Path(paths["err"]).read_text())
        return subprocess.CompletedProcess(argv, answer["status"], Path(paths["out"]).read_text(),
                                           Path(paths["err"]).read_text())
