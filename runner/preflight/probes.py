"""Probes of this machine and its network, each answering None (fine) or why not, knowing nothing of the config:
can this directory be written, is this port free, does this MLflow server answer. runner.preflight.needs asks them
about the config's directories, TF_CONFIG addresses and tracking URI; runner.app about Hydra's run directory
before Hydra makes it; runner.deliver about the server it delivers to.
"""

import os
import socket
import tempfile
import urllib.error
import urllib.parse
import urllib.request


def working_dir_problem() -> str | None:
    """None when this process's working directory still exists; else why not (it was deleted or moved under the
    shell that started the command: Hydra's outputs/ and the default ./mlflow.db are written there)."""
    try:
        os.getcwd()
    except OSError as err:
        return (
            f"the working directory is gone ({err.strerror}): it was deleted or moved after this shell entered it, and "
            "outputs/, multirun/ and the default ./mlflow.db are written there. cd to an existing directory and run again."
        )
    return None


def writable_dir_problem(path: str) -> str | None:
    """None when `path` is, or can be made, a directory this process can write in; else why not. Directories made
    for the probe are removed again (the run makes them when it needs them). Safe with other processes probing the
    same path at once (the tasks of a cluster share their checkpoint directory): one's directory may vanish under
    another's probe, which then tries again."""
    path = os.path.abspath(os.path.expanduser(path))
    for _ in range(5):
        problem = _probe(path)
        if not (problem or "").startswith(_VANISHED):
            return problem
    return problem[len(_VANISHED) :]


_VANISHED = "vanished: "  # a directory on the way went away (another probe's, or a path that cannot hold one)


def _probe(path: str) -> str | None:
    made, parent = [], path
    while not os.path.exists(parent):
        made.append(parent)
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        return f"{parent} is a file, not a directory" if os.path.exists(parent) else f"{_VANISHED}{parent} went away"
    mine = []
    try:
        for d in reversed(made):
            try:
                os.mkdir(d)
                mine.append(d)
            except FileExistsError:  # another process made it meanwhile: not ours to remove
                pass
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-probe-") as f:  # bytes too: a full disk takes an empty file
            f.write(b"\0" * 4096)
            f.flush()
            os.fsync(f.fileno())
    except OSError as err:
        why = f"{err.strerror or err}" + (f" ({err.filename})" if err.filename else "")
        # FileNotFoundError: another process's probe may have removed a directory on the way; try again
        return f"{_VANISHED}{why}" if isinstance(err, FileNotFoundError) else why
    finally:
        for d in reversed(mine):  # innermost first
            try:
                os.rmdir(d)
            except OSError:
                break
    return None


def local_host(host: str) -> bool:
    """Whether `host` names this machine."""
    return host in ("127.0.0.1", "localhost", "0.0.0.0", "::1", "[::1]", socket.gethostname(), socket.getfqdn())


def port_in_use(port: int) -> bool:
    """Whether a server could not listen on the port now: TensorFlow's gRPC server binds 0.0.0.0:port, so any
    listener on the port, on any address, is in its way."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a port in TIME_WAIT is free for a server
        try:
            s.bind(("", port))
        except OSError:
            return True
    return False


def connect_problem(host: str, port: int, timeout: float = 5.0) -> str | None:
    """None when host:port accepts a TCP connection now, else why not."""
    try:
        socket.create_connection((host, port), timeout=timeout).close()
        return None
    except OSError as err:
        return err.strerror or str(err)


def tracking_problem(uri: str, timeout: float = 3.0):
    """None when an http(s) tracking server answers /health, else why not. Other stores are not probed."""
    if not uri.startswith(("http://", "https://")):
        return None
    parts = urllib.parse.urlsplit(uri)
    host = f"[{parts.hostname}]" if parts.hostname and ":" in parts.hostname else parts.hostname
    netloc = f"{host}:{parts.port}" if parts.port else host  # without user:password, which urllib cannot take here
    try:
        with urllib.request.urlopen(
            urllib.parse.urlunsplit((parts.scheme, netloc, parts.path.rstrip("/") + "/health", "", "")), timeout=timeout
        ):
            return None
    except urllib.error.HTTPError as err:
        if err.code in (401, 403):
            return None  # an auth proxy in front of it: MLflow's own credentials (MLFLOW_TRACKING_TOKEN...) apply later
        return f"it answered HTTP {err.code} on /health: is it an MLflow tracking server?"
    except (urllib.error.URLError, OSError) as err:
        return str(getattr(err, "reason", err))
