"""The trial processes' fork server (child side): ``python -m sweeper.trial._child.zygote``.

It imports torch, transformers, peft and bitsandbytes once (:func:`~sweeper.trial._child.worker.import_heavy`, about
9 s on 2 CPU cores), then forks a trial process per request of the sweep (:mod:`sweeper.trial._zygote`): a fresh
process whose imports are already done, as a forkserver's children are (Python's ``multiprocessing`` forkserver with
``set_forkserver_preload``; Android's zygote). A fork is a new address space: what a trial leaves behind (memory, a
broken allocator, a CUDA context) is never inherited, since the zygote itself never runs a trial.

Requests arrive as JSON datagrams on a ``SOCK_SEQPACKET`` socket (its descriptor in ``SWEEPER_ZYGOTE_FD``), typed
both ways in :mod:`sweeper.trial._zygote_protocol`:

- ``{"op": "fork", "cwd": ..., "env": {...}}`` with three descriptors (the trial process's stdin, its log, the
  write end of its control pipe): the child becomes the leader of its own session and process group (so that a
  ``killpg`` of its pid reaches everything it starts), faults in the library pages the zygote has resident (so
  that its resident set, the CPU's peak memory, is a started process's: :func:`resident_file_pages`), takes the
  descriptors as stdin, stdout/stderr and ``SWEEPER_CONTROL_FD``, takes ``cwd`` and exactly ``env`` (as
  ``subprocess.Popen`` would give it), dies with the zygote (``PR_SET_PDEATHSIG``) and serves trials
  (:func:`sweeper.trial._child.worker.main` with ``--serve``). The reply is ``{"pid": N}``, sent once the child
  leads its process group.
- ``{"op": "poll", "pid": N}``: ``{"returncode": ...}``, None while it runs, else as ``subprocess.Popen.returncode``
  (negative: the signal that killed it). The zygote reaps only children it is asked about.

The zygote exits when the sweep's end of the socket closes (the sweep ended, however it ended); its children then
die with it. It is not used where CUDA is visible: a CUDA context cannot cross a fork, and the zygote's imports may
initialise one (bitsandbytes probes the device at import).
"""

from __future__ import annotations

import ctypes
import os
import socket
import struct
import sys
import traceback

from sweeper.trial._zygote_protocol import (
    MAX_REQUEST_BYTES,
    ZYGOTE_FD_ENV,
    ForkRequest,
    Request,
    ZygoteReply,
    read_request,
)

#: ``madvise`` advice that faults a range's pages into the page tables without writing them (Linux 5.14).
_MADV_POPULATE_READ = 22


def resident_file_pages() -> list[tuple[int, int]]:
    """The readable file-backed pages (shared libraries, their data) this process has in its page tables, as
    ``(address, bytes)`` runs, from ``/proc/self/maps`` and ``/proc/self/pagemap`` (bit 63: present); [] without
    them.

    A fork copies the page tables of anonymous memory but not those of file-backed mappings (the kernel refills
    them on a fault), so a forked child's resident set lacks the library pages its parent touched: measured, 0.13 of
    0.52 GiB after the heavy imports. The CPU's peak memory is the resident set, so :func:`fault_in` puts them back
    and a forked trial measures what a started one does."""
    page = os.sysconf("SC_PAGE_SIZE")
    runs: list[tuple[int, int]] = []
    try:
        with open("/proc/self/maps") as maps, open("/proc/self/pagemap", "rb") as pagemap:
            for line in maps:
                fields = line.split()
                if len(fields) < 6 or not fields[5].startswith("/") or not fields[1].startswith("r"):
                    continue
                low, high = (int(x, 16) for x in fields[0].split("-"))
                pagemap.seek(low // page * 8)
                entries = struct.unpack(f"<{(high - low) // page}Q", pagemap.read((high - low) // page * 8))
                start = None
                for i, entry in enumerate((*entries, 0)):
                    if entry >> 63 and start is None:
                        start = i
                    elif not entry >> 63 and start is not None:
                        runs.append((low + start * page, (i - start) * page))
                        start = None
    except (OSError, ValueError, struct.error):
        return []
    return runs


def fault_in(runs: list[tuple[int, int]]) -> None:
    """Fault ``runs`` (:func:`resident_file_pages` of the zygote) into this process's page tables
    (``MADV_POPULATE_READ``; 17 ms for 0.13 GiB measured); where the kernel lacks it, nothing."""
    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    for address, length in runs:
        if madvise(address, length, _MADV_POPULATE_READ) != 0 and ctypes.get_errno() == 22:  # EINVAL: before 5.14
            return


def _become_trial_process(
    sock: socket.socket, request: ForkRequest, fds: list[int], ready: int, pages: list[tuple[int, int]]
) -> None:
    """In the forked child: its own session, the zygote's resident library pages, the request's descriptors,
    working directory and environment, death with the zygote; then serve trials. Never returns."""
    os.setsid()
    fault_in(pages)
    os.write(ready, b"1")
    os.close(ready)
    sock.close()
    stdin_fd, log_fd, control_fd = fds
    os.dup2(stdin_fd, 0)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(stdin_fd)
    os.close(log_fd)
    os.chdir(request.cwd)
    os.environ.clear()
    os.environ.update(request.env)
    os.environ["SWEEPER_CONTROL_FD"] = str(control_fd)
    os.environ["SWEEPER_PARENT_PID"] = str(os.getppid())
    from sweeper.trial._child._process import die_with_parent
    from sweeper.trial._child.worker import main

    die_with_parent()
    main(["--serve"])  # ends with os._exit


def _fork(sock: socket.socket, request: ForkRequest, fds: list[int], pages: list[tuple[int, int]]) -> int:
    """Fork a trial process for ``request``; its pid once it leads its own process group."""
    if len(fds) != 3:
        for fd in fds:
            os.close(fd)
        raise ValueError(f"a fork request carries 3 descriptors, not {len(fds)}")
    read_end, write_end = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read_end)
            _become_trial_process(sock, request, fds, write_end, pages)
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(1)
    os.close(write_end)
    for fd in fds:  # the child's alone now: its control pipe must reach EOF when it dies
        os.close(fd)
    os.read(read_end, 1)  # empty if the child died first: its exit status says so
    os.close(read_end)
    return pid


def _poll(pid: int, ended: dict[int, int]) -> int | None:
    """The child's return code as ``subprocess.Popen`` gives it, None while it runs."""
    if pid in ended:
        return ended[pid]
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return ended.get(pid, 0)
    if done == 0:
        return None
    ended[pid] = os.waitstatus_to_exitcode(status)
    return ended[pid]


def _answer(
    sock: socket.socket,
    request: Request,
    fds: list[int],
    ended: dict[int, int],
    pages: list[tuple[int, int]],
) -> ZygoteReply:
    if isinstance(request, ForkRequest):
        return ZygoteReply(pid=_fork(sock, request, fds, pages))
    for fd in fds:
        os.close(fd)
    return ZygoteReply(returncode=_poll(request.pid, ended))


def _close_quietly(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


def main() -> None:
    """Import the heavy libraries, then answer requests until the sweep's end of the socket closes."""
    sock = socket.socket(fileno=int(os.environ.pop(ZYGOTE_FD_ENV)))
    # As the worker's main() does before its imports: pyarrow's mimalloc pool would reserve 1 GiB under RLIMIT_DATA.
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
    from sweeper.trial._child.worker import import_heavy

    import_heavy()
    pages = resident_file_pages()
    ended: dict[int, int] = {}
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(sock, MAX_REQUEST_BYTES, 3)
        except OSError:
            break
        if not message:
            break
        try:
            request = read_request(message)
        except (ValueError, TypeError) as exc:  # nothing was done with its descriptors
            for fd in fds:
                _close_quietly(fd)
            reply = ZygoteReply(error=f"{type(exc).__name__}: {exc}")
        else:
            try:
                reply = _answer(sock, request, fds, ended, pages)
            except (ValueError, OSError) as exc:
                reply = ZygoteReply(error=f"{type(exc).__name__}: {exc}")
        try:
            sock.send(reply.to_bytes())
        except OSError:
            break
    os._exit(0)


if __name__ == "__main__":
    main()
