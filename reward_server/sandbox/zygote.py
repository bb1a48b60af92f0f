# The zygote of a sandbox pool slot (sandbox_pool.h): pid 1 of the slot's pid
# namespace, inside the slot's bwrap sandbox, started once per slot. For each
# program the server sends, it forks; the child becomes the program (running a
# Python script in this already warm interpreter, or exec()ing anything
# else); once the child has exited, the zygote kills every other process of
# the namespace, empties the writable directories and checks that nothing is
# left before it takes the next program. Embedded into the server at build
# time; the server passes its settings as one JSON argument.
#
# Protocol on fd 3 (a Unix stream socket to the server), one run at a time:
#   zygote -> server  {"event": "ready"}\n                      once, when warm
#   server -> zygote  u32 length (little endian) of the JSON header, sent with
#                     the run's descriptors (SCM_RIGHTS: stdout, stderr,
#                     secret, result), then the header {"argv", "env",
#                     "files": [{"path", "size"}], "cpu_seconds"}, then the
#                     files' bytes in order
#   zygote -> server  {"event": "exit", "kind": "exited"|"signaled", "code": N}\n
#                     or {"event": "exec_error", "message": ...}\n
#   zygote -> server  {"event": "done", "clean": true|false, "reason": ...}\n
# Anything unexpected ends the zygote, and with it the slot (the server sees
# the socket close and starts a new slot).
#
# Why a program cannot reach the next one through the zygote: the zygote is
# the namespace's init, which the kernel protects from signals sent inside
# the namespace; it is not dumpable (the server runs it from an execute-only
# copy of the interpreter, and the kernel marks a process that execs a file
# it cannot read as not dumpable), so /proc/1/mem, /proc/1/fd and ptrace are
# closed to processes of its own uid; its socket is closed in the child
# before the program runs; and the child's changes to the interpreter
# (modules, builtins, environment, signal handlers, rlimits) live in the
# child's own copy of memory. Only modules of a minimal Python install are
# used (no ctypes).
import builtins
import json
import os
import resource
import signal
import socket
import stat
import struct
import sys
import traceback
import types

CONTROL_FD = 3

def _send(sock, message):
    sock.sendall(json.dumps(message).encode() + b"\n")


def _recv_exactly(sock, size):
    chunks = []
    while size > 0:
        chunk = sock.recv(min(size, 1 << 20))
        if not chunk:
            raise EOFError("the server closed the control socket")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def _receive_run(sock):
    """The next run's header, file contents and descriptors; None at EOF."""
    fds = []
    head = b""
    while len(head) < 4:
        data, ancillary, _, _ = sock.recvmsg(4 - len(head), socket.CMSG_SPACE(16 * 4))
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                usable = len(payload) - len(payload) % 4
                fds.extend(struct.unpack(f"{usable // 4}i", payload[:usable]))
        if not data:
            if head or fds:
                raise EOFError("the control socket closed mid-message")
            return None
        head += data
    (length,) = struct.unpack("<I", head)
    header = json.loads(_recv_exactly(sock, length))
    contents = [_recv_exactly(sock, f["size"]) for f in header["files"]]
    if len(fds) != 4:
        raise ValueError(f"expected 4 descriptors, got {len(fds)}")
    return header, contents, fds


def _place_files(header, contents):
    for entry, data in zip(header["files"], contents):
        path = entry["path"]
        os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o444)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)


# -- The child: becomes the program -------------------------------------------

def _exit_status_of(exit_exception):
    code = exit_exception.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    try:
        sys.stderr.write(str(code) + "\n")
    except BaseException:
        pass
    return 1


def _run_warm(argv, mode, target, args):
    """Runs `python -I [-B] SCRIPT|-c CODE ARGS` in this interpreter."""
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = main
    status = 0
    try:
        if mode == "-c":
            sys.argv = ["-c"] + args
            code = compile(target, "<string>", "exec")
        else:
            sys.argv = [target] + args
            main.__file__ = target
            main.__cached__ = None
            try:
                with open(target, "rb") as f:
                    source = f.read()
            except OSError as e:
                sys.stderr.write(f"{argv[0]}: can't open file {target!r}: [Errno {e.errno}] "
                                 f"{e.strerror}\n")
                return 2
            code = compile(source, target, "exec")
        exec(code, main.__dict__)
    except SystemExit as e:
        status = _exit_status_of(e)
    except BaseException as e:
        # As the interpreter prints it, without this file's frames.
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
            tb = tb.tb_next
        try:
            # The hook prints the exception's own traceback: replace it.
            sys.excepthook(type(e), e.with_traceback(tb), tb)
        except BaseException:
            pass
        status = 1
    # What the interpreter does on its way out.
    try:
        threading = sys.modules.get("threading")
        if threading is not None:
            threading._shutdown()
        import atexit
        atexit._run_exitfuncs()
    except SystemExit as e:
        status = _exit_status_of(e)
    except BaseException:
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    return status


def _warm_command(argv, python):
    """(mode, target, args) when argv is this interpreter (`python`, its path
    as programs know it) in isolated mode."""
    if not argv or argv[0] != python:
        return None
    flags = set()
    i = 1
    while i < len(argv) and argv[i].startswith("-") and argv[i] != "-c":
        flags.add(argv[i])
        i += 1
    if "-I" not in flags or not flags <= {"-I", "-B", "-E", "-s"}:
        return None
    if i >= len(argv) or argv[i] == "-":
        return None
    if argv[i] == "-c":
        if i + 1 >= len(argv):
            return None
        return "-c", argv[i + 1], argv[i + 2:]
    return "script", argv[i], argv[i + 1:]


def _child(header, fds, exec_error_w, settings):
    """In the forked child: never returns."""
    try:
        os.setsid()
        # Descriptors 0-4 as the program expects them, 5 the exec-error pipe
        # (close-on-exec), every other one closed.
        devnull = os.open("/dev/null", os.O_RDONLY)
        top = max(fds + [devnull, exec_error_w]) + 1
        moved = [os.dup2(fd, top + i, inheritable=False) for i, fd in enumerate([devnull] + fds)]
        moved_error = os.dup2(exec_error_w, top + 5, inheritable=False)
        for target, fd in enumerate(moved):
            os.dup2(fd, target, inheritable=True)
        error_w = os.dup2(moved_error, 5, inheritable=False)
        os.closerange(6, 1 << 16)
        limit = settings["max_processes"]
        resource.setrlimit(resource.RLIMIT_NPROC, (limit, limit))
        cpu = header["cpu_seconds"]
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        size = settings["max_file_bytes"]
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
        os.umask(0o022)
        os.chdir("/tmp")
        os.environ.clear()
        for key, value in header["env"]:
            os.environ[key] = value
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        argv = header["argv"]
        sys.executable = settings["python"]
        warm = _warm_command(argv, settings["python"])
        if warm is None:
            for sig in signal.valid_signals():
                if sig not in (signal.SIGKILL, signal.SIGSTOP):
                    try:
                        signal.signal(sig, signal.SIG_DFL)
                    except (OSError, ValueError):
                        pass
            try:
                os.execve(argv[0], argv, dict(os.environ))
            except OSError as e:
                os.write(error_w, f"execvp {argv[0]}: {e.strerror}".encode())
                os._exit(127)
        os.close(error_w)
        # A fresh interpreter's dispositions: SIGINT raises KeyboardInterrupt,
        # SIGPIPE and SIGXFSZ are ignored (so they become OSErrors).
        for sig in signal.valid_signals():
            if sig in (signal.SIGKILL, signal.SIGSTOP):
                continue
            try:
                if sig == signal.SIGINT:
                    signal.signal(sig, signal.default_int_handler)
                elif sig in (signal.SIGPIPE, signal.SIGXFSZ):
                    signal.signal(sig, signal.SIG_IGN)
                else:
                    signal.signal(sig, signal.SIG_DFL)
            except (OSError, ValueError):
                pass
        mode, target, args = warm
        os._exit(_run_warm(argv, mode, target, args))
    except BaseException:
        try:
            traceback.print_exc()
        except BaseException:
            pass
        os._exit(127)


# -- Between runs: nothing of one program may reach the next --------------------

def _other_pids():
    return [name for name in os.listdir("/proc") if name.isdigit() and name != "1"]


def _kill_everything():
    """Kills and reaps every process of the namespace but this one."""
    for _ in range(100):
        try:
            os.kill(-1, signal.SIGKILL)  # Everyone but the caller and init (us).
        except ProcessLookupError:
            pass
        while True:
            try:
                os.waitpid(-1, 0)
            except ChildProcessError:
                break
            except InterruptedError:
                continue
        if not _other_pids():
            return None
    return f"processes survived: {_other_pids()}"


def _wipe(path, top_mode):
    """Empties directory `path` (a program may have taken its permissions
    away: it ran as our uid, so we can give them back); restores top_mode."""
    mode = stat.S_IMODE(os.lstat(path).st_mode)
    if mode & 0o700 != 0o700:
        os.chmod(path, mode | 0o700)
    for name in os.listdir(path):
        child = os.path.join(path, name)
        if stat.S_ISDIR(os.lstat(child).st_mode):
            _wipe(child, None)
            os.rmdir(child)
        else:
            os.unlink(child)
    if top_mode is not None and stat.S_IMODE(os.lstat(path).st_mode) != top_mode:
        os.chmod(path, top_mode)


def _sysv_ipc_left():
    for kind in ("shm", "sem", "msg"):
        try:
            with open(f"/proc/sysvipc/{kind}") as f:
                if len(f.read().strip().splitlines()) > 1:
                    return f"System V {kind} objects left"
        except OSError:
            pass
    return None


def _clean(wiped):
    """None when the slot is as it was before the run, else why not."""
    problem = _kill_everything()
    if problem:
        return problem
    try:
        for path, mode in wiped:
            _wipe(path, mode)
            if os.listdir(path):
                return f"{path} is not empty"
    except (OSError, RecursionError) as e:
        return f"cannot empty the writable directories: {e}"
    return _sysv_ipc_left()


def main():
    settings = json.loads(sys.argv[1])
    # As init, only signals with a handler reach us from inside the namespace;
    # make sure there is none (Python installs one for SIGINT).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for name in settings["preload"]:
        try:
            __import__(name)
        except BaseException:
            pass
    os.chdir("/")
    wiped = [(path, stat.S_IMODE(os.stat(path).st_mode)) for path in settings["writable"]]
    sock = socket.socket(fileno=CONTROL_FD)
    _send(sock, {"event": "ready"})
    while True:
        run = _receive_run(sock)
        if run is None:
            return
        header, contents, fds = run
        exec_error_r, exec_error_w = os.pipe2(os.O_CLOEXEC)
        try:
            _place_files(header, contents)
        except OSError as e:
            for fd in fds + [exec_error_r, exec_error_w]:
                os.close(fd)
            _send(sock, {"event": "exec_error", "message": f"placing the program's files: {e}"})
            reason = _clean(wiped)
            _send(sock, {"event": "done", "clean": reason is None, "reason": reason or ""})
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            sock.close()
            os.close(exec_error_r)
            _child(header, fds, exec_error_w, settings)
        for fd in fds + [exec_error_w]:
            os.close(fd)
        while True:
            try:
                _, status = os.waitpid(pid, 0)
                break
            except InterruptedError:
                continue
        exec_error = os.read(exec_error_r, 4096)
        os.close(exec_error_r)
        if exec_error:
            _send(sock, {"event": "exec_error", "message": exec_error.decode("utf-8", "replace")})
        elif os.WIFSIGNALED(status):
            _send(sock, {"event": "exit", "kind": "signaled", "code": os.WTERMSIG(status)})
        else:
            _send(sock, {"event": "exit", "kind": "exited", "code": os.WEXITSTATUS(status)})
        reason = _clean(wiped)
        _send(sock, {"event": "done", "clean": reason is None, "reason": reason or ""})


if __name__ == "__main__":
    main()
