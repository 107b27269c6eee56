"""``python -m phrasescore ARGS`` in a child process forked from one that has imported PyTorch.

Most of a CLI test's time was the interpreter importing PyTorch (and, in every training, the
torch._dynamo that PyTorch's optimisers import, and matplotlib for the learning curve) before
phrasescore did anything. Here one server process per pytest process imports them once, and forks
a child for each call: the child is a process of its own (its exit status, its stdin, stdout and
stderr, its working directory, signals), and it runs ``phrasescore``'s ``__main__`` as
``python -m phrasescore`` does. Only the package's ``__init__`` (which sets the OpenMP and oneDNN
environment before PyTorch loads) is imported beforehand: every other phrasescore module is
imported by the child, so the lazy imports a user's process runs are the ones tested.

A call with its own environment (``env=``) runs in a fresh interpreter instead: the OpenMP
runtime reads its environment when PyTorch loads, which in the server happened once.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading

SERVER = r"""
import atexit, gc, json, os, runpy, signal, socket, struct, sys, traceback

import phrasescore  # its environment settings first, as in `python -m phrasescore`
import matplotlib.figure  # noqa: F401
import torch  # noqa: F401
import torch._dynamo  # noqa: F401

# what is imported now is shared with the children: no collection may walk (and so copy) it
gc.freeze()
channel = socket.socket(fileno=int(sys.argv[1]))


def run_child(request, fds):
    channel.close()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = ["python -m phrasescore", *request["args"]]
    code = 0
    try:
        runpy.run_module("phrasescore", run_name="__main__", alter_sys=True)
    except SystemExit as stop:
        if isinstance(stop.code, int) or stop.code is None:
            code = stop.code or 0
        else:
            print(stop.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:
        traceback.print_exc()
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException:
        traceback.print_exc()
        code = 1
    # the interpreter's exit, less the teardown of the modules the server imported (the same
    # exit handlers and flushes; an unwritable stdout exits 120 as Python's does)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            code = 120
    os._exit(code)


while True:
    try:
        message, fds, _, _ = socket.recv_fds(channel, 1 << 20, 3)
    except OSError:
        break
    if not message:
        break
    pid = os.fork()
    if pid == 0:
        run_child(json.loads(message), fds)
    for fd in fds:
        os.close(fd)
    channel.sendall(struct.pack("!q", pid))
    _, status = os.waitpid(pid, 0)
    channel.sendall(struct.pack("!q", os.waitstatus_to_exitcode(status)))
"""

_lock = threading.Lock()
_server: tuple[subprocess.Popen, socket.socket] | None = None


def _channel() -> socket.socket:
    """The socket to this process's server, which is started on first use."""
    global _server
    if _server is None or _server[0].poll() is not None:
        ours, theirs = socket.socketpair()
        process = subprocess.Popen(
            [sys.executable, "-c", SERVER, str(theirs.fileno())],
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,  # the children's stdout is buffered as a pipe's, not a tty's
        )
        theirs.close()
        _server = (process, ours)
        atexit.register(_stop, process, ours)
    return _server[1]


def _stop(process: subprocess.Popen, channel: socket.socket) -> None:
    channel.close()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()


def _receive(channel: socket.socket) -> int:
    data = b""
    while len(data) < 8:
        chunk = channel.recv(8 - len(data))
        if not chunk:
            raise RuntimeError("the forking server of the tests ended")
        data += chunk
    return struct.unpack("!q", data)[0]


def _text(data: bytes) -> str:
    """As ``subprocess.run(text=True)`` decodes: universal newlines."""
    return data.decode().replace("\r\n", "\n").replace("\r", "\n")


def run_phrasescore(
    args: list[str],
    cwd: str | os.PathLike | None = None,
    input: str | None = None,  # noqa: A002  (subprocess.run's name)
    stdin=None,
    timeout: float | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess:
    """``python -m phrasescore ARGS`` with its output captured as text, as ``subprocess.run``
    returns it; its stdin is ``input``, or the open file ``stdin``, else nothing."""
    command = [sys.executable, "-m", "phrasescore", *args]
    if env is not None:
        return subprocess.run(
            command,
            cwd=cwd,
            input=input,
            stdin=stdin,
            timeout=timeout,
            env=env,
            capture_output=True,
            text=True,
        )
    with (
        tempfile.TemporaryFile() as given,
        tempfile.TemporaryFile() as stdout,
        tempfile.TemporaryFile() as stderr,
        open(os.devnull, "rb") as nothing,
        _lock,
    ):
        if input is not None:
            given.write(input.encode())
            given.seek(0)
            stdin = given
        request = {
            "args": args,
            "cwd": os.path.abspath(cwd or os.getcwd()),
            "env": dict(os.environ),
        }
        fds = [(stdin or nothing).fileno(), stdout.fileno(), stderr.fileno()]
        channel = _channel()
        socket.send_fds(channel, [json.dumps(request).encode()], fds)
        pid = _receive(channel)
        channel.settimeout(timeout)
        try:
            code = _receive(channel)
        except TimeoutError:
            os.kill(pid, signal.SIGKILL)
            channel.settimeout(None)
            _receive(channel)
            raise subprocess.TimeoutExpired(command, timeout) from None
        finally:
            channel.settimeout(None)
        stdout.seek(0)
        stderr.seek(0)
        return subprocess.CompletedProcess(
            command, code, _text(stdout.read()), _text(stderr.read())
        )
