"""``python -m phrasescore ARGS`` in a child process forked from one that has imported PyTorch.

Most of a CLI test's time was the interpreter importing PyTorch (and, in every training, the
torch._dynamo that PyTorch's optimisers import, and matplotlib for the learning curve) before
phrasescore did anything. Here one server process per pytest process imports them once, and forks
a child for each call: the child is a process of its own (its exit status, its stdin, stdout and
stderr, its working directory, signals), and it runs ``phrasescore``'s ``__main__`` as
``python -m phrasescore`` does. Only the package's ``__init__`` (which sets the OpenMP and oneDNN
environment before PyTorch loads) is imported beforehand: every other phrasescore module is
imported by the child, so the lazy imports a user's process runs are the ones tested.

Tests call :func:`run_phrasescore`. Programs that run ``phrasescore`` themselves (the bin/ scripts,
through their ``PHRASESCORE`` variable) get :func:`client_environment`: this file run as a script
is a small client that hands the server its own stdin, stdout and stderr and passes SIGINT,
SIGTERM and SIGHUP on to the child, and ends as the child ended.

A call with its own environment (``env=``) runs in a fresh interpreter instead: the OpenMP
runtime reads its environment when PyTorch loads, which in the server happened once.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

SOCKET_VARIABLE = "PHRASESCORE_TEST_FORK_SERVER"
STOPPING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
"""Signals a child ignores when its caller does (an ignored signal stays ignored across exec)."""

SERVER = r"""
import atexit, gc, json, os, runpy, selectors, signal, socket, struct, sys, traceback

import phrasescore  # its environment settings first, as in `python -m phrasescore`
import matplotlib.figure  # noqa: F401
import torch  # noqa: F401
import torch._dynamo  # noqa: F401

# what is imported now is shared with the children: no collection may walk (and so copy) it
gc.freeze()
listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
listener.bind(sys.argv[1])
listener.listen(64)
parent = os.getppid()


def run_child(request, fds):
    for number in request["ignored"]:  # as the caller's own child would inherit them
        signal.signal(number, signal.SIG_IGN)
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


waiting = {}  # child pid -> the connection that asked for it
selector = selectors.DefaultSelector()
selector.register(listener, selectors.EVENT_READ)
while os.getppid() == parent:
    for key, _ in selector.select(timeout=0.02):
        connection, _ = listener.accept()
        message, fds, _, _ = socket.recv_fds(connection, 1 << 20, 3)
        pid = os.fork()
        if pid == 0:
            selector.close()
            for held in [listener, connection, *waiting.values()]:
                held.close()
            run_child(json.loads(message), fds)
        for fd in fds:
            os.close(fd)
        connection.sendall(struct.pack("!q", pid))
        waiting[pid] = connection
    while waiting:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            break
        connection = waiting.pop(pid, None)
        if connection is not None:
            try:
                connection.sendall(struct.pack("!q", os.waitstatus_to_exitcode(status)))
            except OSError:
                pass
            connection.close()
"""

_server: subprocess.Popen | None = None
_address = ""


def _server_address() -> str:
    """The socket of this process's server, which is started on first use."""
    global _server, _address
    if _server is None or _server.poll() is not None:
        # a short path: a socket's name holds at most 107 bytes, whatever TMPDIR is
        folder = tempfile.mkdtemp(prefix="phrasescore-fork-", dir="/tmp")
        _address = os.path.join(folder, "server")
        _server = subprocess.Popen(
            [sys.executable, "-c", SERVER, _address],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,  # the children's stdout is buffered as a pipe's, not a tty's
        )
        atexit.register(_stop, _server, folder)
    return _address


def _stop(server: subprocess.Popen, folder: str) -> None:
    server.terminate()
    try:
        server.wait(timeout=10)
    except subprocess.TimeoutExpired:
        server.kill()
    shutil.rmtree(folder, ignore_errors=True)


def _connect(address: str) -> socket.socket:
    """A connection to the server, once it listens (it imports PyTorch first)."""
    for _ in range(6000):
        channel = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            channel.connect(address)
            return channel
        except (FileNotFoundError, ConnectionRefusedError):
            channel.close()
            if _server is not None and _server.poll() is not None:
                break
            time.sleep(0.02)
    raise RuntimeError(f"the tests' forking server at {address} does not answer")


def _receive(channel: socket.socket) -> int:
    data = b""
    while len(data) < 8:
        chunk = channel.recv(8 - len(data))
        if not chunk:
            raise RuntimeError("the tests' forking server ended")
        data += chunk
    return struct.unpack("!q", data)[0]


def _start(address: str, args: list[str], cwd: str, fds: list[int]) -> tuple[socket.socket, int]:
    """Ask the server for a child running ``phrasescore ARGS`` on these stdin, stdout, stderr."""
    channel = _connect(address)
    ignored = [int(n) for n in STOPPING if signal.getsignal(n) == signal.SIG_IGN]
    request = {
        "args": args,
        "cwd": os.path.abspath(cwd),
        "env": dict(os.environ),
        "ignored": ignored,
    }
    socket.send_fds(channel, [json.dumps(request).encode()], fds)
    return channel, _receive(channel)


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
    ):
        if input is not None:
            given.write(input.encode())
            given.seek(0)
            stdin = given
        fds = [(stdin or nothing).fileno(), stdout.fileno(), stderr.fileno()]
        channel, pid = _start(_server_address(), args, str(cwd or os.getcwd()), fds)
        with channel:
            channel.settimeout(timeout)
            try:
                code = _receive(channel)
            except TimeoutError:
                os.kill(pid, signal.SIGKILL)
                channel.settimeout(None)
                _receive(channel)
                raise subprocess.TimeoutExpired(command, timeout) from None
        stdout.seek(0)
        stderr.seek(0)
        return subprocess.CompletedProcess(
            command, code, _text(stdout.read()), _text(stderr.read())
        )


def client_environment() -> dict[str, str]:
    """``PHRASESCORE`` (the command the bin/ scripts run phrasescore with) as this file's client
    of this process's server, and where the server listens."""
    return {
        "PHRASESCORE": f"{sys.executable} {os.path.abspath(__file__)}",
        SOCKET_VARIABLE: _server_address(),
    }


def _client(args: list[str]) -> None:
    """``phrasescore ARGS`` on this process's stdin, stdout and stderr, in a child of the server;
    the signals that stop a program are passed on to it, and this process ends as it ended."""
    channel, pid = _start(os.environ[SOCKET_VARIABLE], args, os.getcwd(), [0, 1, 2])

    def pass_on(number, _frame):
        try:
            os.kill(pid, number)
        except ProcessLookupError:
            pass

    for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(number) != signal.SIG_IGN:
            signal.signal(number, pass_on)
    code = _receive(channel)
    if code < 0:  # killed by a signal: so is this process
        if -code not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(code)


if __name__ == "__main__":
    _client(sys.argv[1:])
