"""Hosts on one machine: one Linux network namespace per task, joined by a bridge, for the tests and benchmarks.

    root namespace:   bridge <tag>br  --  veth <tag>h0, <tag>h1, ...
    namespace <tag>-i:  eth0 (the veth's other end) 198.18.0.<i+1>/24, lo

Addresses come from 198.18.0.0/15, the range reserved for network testing (RFC 2544). The namespaces have no default
route and the bridge has no address: a task can reach only the other namespaces of its cluster, nothing else. A
task runs with `ip netns exec <tag>-i <command>` (the filesystem, processes and users are the machine's own, only
the network is the namespace's), as a Kubernetes pod runs the same command with its own address.

Every name starts with `rn<pid>x<n>` (the creating process's id and a counter), so `stop()` removes exactly what
this cluster made, and `clean_leftovers()` removes what a crashed run left behind (names whose process is gone),
without touching a cluster another process is using. Faults: `link_down(i)` / `link_up(i)` (the task's veth in the
root namespace), `rate_limit(i, rate)` (a tbf qdisc on it; netem is not in this kernel).
"""

import contextlib
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import time

PREFIX = "rn"
NAME = re.compile(rf"^{PREFIX}(\d+)x\d+")
SUBNET = "198.18.0"  # 198.18.0.0/15: reserved for network testing
_counter = itertools.count()


class NetnsUnavailable(Exception):
    """Why this machine cannot make the namespaces (the tests skip with it)."""


def _ip(*args, check=True):
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {proc.stderr.strip()}")
    return proc


def _tc(*args):
    proc = subprocess.run(["tc", *args], capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        raise RuntimeError(f"tc {' '.join(args)}: {proc.stderr.strip()}")
    return proc


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def namespaces() -> list[str]:
    return [line.split()[0] for line in _ip("netns", "list").stdout.splitlines() if line.strip()]


def links() -> list[str]:
    return [m.group(1) for m in re.finditer(r"^\d+: ([^:@\s]+)", _ip("-o", "link", "show").stdout, re.M)]


def ours(names, tag=None) -> list[str]:
    """The names that belong to cluster `tag`, or (tag None) to any cluster of this helper."""
    return [n for n in names if (n.startswith(tag) if tag else NAME.match(n))]


def clean_leftovers() -> list[str]:
    """Remove namespaces, veths and bridges of clusters whose creating process is gone (a crashed run). Returns them."""
    removed = []
    for name in ours(namespaces()):
        if not _alive(int(NAME.match(name).group(1))):
            _kill_in(name)
            _ip("netns", "delete", name, check=False)
            removed.append(name)
    for name in ours(links()):
        if not _alive(int(NAME.match(name).group(1))):
            _ip("link", "delete", name, check=False)
            removed.append(name)
    for name in ours(os.listdir("/etc/netns") if os.path.isdir("/etc/netns") else []):
        if not _alive(int(NAME.match(name).group(1))):
            shutil.rmtree(f"/etc/netns/{name}", ignore_errors=True)  # a namespace's /etc/hosts
    return removed


def _kill_in(ns: str) -> None:
    """SIGKILL every process still running in namespace `ns`."""
    proc = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=10)
    for pid in proc.stdout.split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)


def check_available() -> None:
    if os.geteuid() != 0:
        raise NetnsUnavailable("creating network namespaces needs root (CAP_NET_ADMIN), and this is not root")
    missing = [tool for tool in ("ip", "tc") if not shutil.which(tool)]
    if missing:
        raise NetnsUnavailable(f"not installed: {', '.join(missing)} (apt-get install iproute2)")


class NetnsCluster:
    """`n` hosts: namespace i has address `address(i)`. Use as a context manager, or call start() and stop()."""

    def __init__(self, n: int):
        self.n = n
        self.tag = f"{PREFIX}{os.getpid()}x{next(_counter)}"
        self.bridge = f"{self.tag}br"
        self.started = False

    def ns(self, i: int) -> str:
        return f"{self.tag}-{i}"

    def veth(self, i: int) -> str:
        """Task i's link, as seen from the root namespace (where the faults are made)."""
        return f"{self.tag}h{i}"

    def address(self, i: int) -> str:
        return f"{SUBNET}.{i + 1}"

    def start(self):
        check_available()
        clean_leftovers()
        self.started = True
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("link", "set", self.bridge, "up")
            for i in range(self.n):
                ns, host, peer = self.ns(i), self.veth(i), f"{self.tag}n{i}"
                _ip("netns", "add", ns)
                _ip("link", "add", host, "type", "veth", "peer", "name", peer)
                _ip("link", "set", peer, "netns", ns)
                _ip("link", "set", host, "master", self.bridge)
                _ip("link", "set", host, "up")
                _ip("-n", ns, "link", "set", peer, "name", "eth0")
                _ip("-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", "eth0")
                _ip("-n", ns, "link", "set", "eth0", "up")
                _ip("-n", ns, "link", "set", "lo", "up")
        except Exception as err:
            self.stop()
            raise NetnsUnavailable(f"could not make the namespaces: {err}") from err
        return self

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def stop(self) -> None:
        """Kill what still runs in the namespaces, then remove them, their veths and the bridge."""
        if not self.started:
            return
        for ns in ours(namespaces(), self.tag):
            _kill_in(ns)
        for ns in ours(namespaces(), self.tag):
            _ip("netns", "delete", ns, check=False)
        for i in range(self.n):
            shutil.rmtree(f"/etc/netns/{self.ns(i)}", ignore_errors=True)
        for link in ours(links(), self.tag):
            _ip("link", "delete", link, check=False)
        self.started = False

    def hosts(self, names: dict) -> None:
        """/etc/hosts in every namespace of this cluster (`ip netns exec` mounts /etc/netns/<ns>/hosts over it):
        the machine's own, then `names` ({host name: address})."""
        with open("/etc/hosts") as f:
            base = f.read()
        lines = "".join(f"{address} {name} {name.split('.')[0]}\n" for name, address in names.items())
        for i in range(self.n):
            os.makedirs(f"/etc/netns/{self.ns(i)}", exist_ok=True)
            with open(f"/etc/netns/{self.ns(i)}/hosts", "w") as f:
                f.write(base.rstrip("\n") + "\n" + lines)

    def leftovers(self) -> list[str]:
        return ours(namespaces(), self.tag) + ours(links(), self.tag)

    # -- running -------------------------------------------------------------------------------------------------
    def command(self, i: int, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.ns(i), *argv]

    def popen(self, i: int, argv: list[str], **kwargs) -> subprocess.Popen:
        """`argv` in namespace i (ip netns exec execs it: the process is argv's own), in a session of its own."""
        return subprocess.Popen(self.command(i, argv), start_new_session=True, **kwargs)

    def pids(self, i: int) -> list[int]:
        proc = subprocess.run(["ip", "netns", "pids", self.ns(i)], capture_output=True, text=True, timeout=10)
        return [int(p) for p in proc.stdout.split()]

    def connects(self, i: int, address: str, port: int, python: str = "python3") -> bool:
        """Whether a TCP connection from namespace i to address:port succeeds within a second."""
        probe = f"import socket; socket.create_connection(({address!r}, {port}), timeout=1)"
        return subprocess.run(self.command(i, [python, "-c", probe]), capture_output=True, timeout=10).returncode == 0

    # -- faults --------------------------------------------------------------------------------------------------
    def link_down(self, i: int) -> None:
        _ip("link", "set", self.veth(i), "down")

    def link_up(self, i: int) -> None:
        _ip("link", "set", self.veth(i), "up")

    def rate_limit(self, i: int, rate: str, burst: str = "32kbit", latency: str = "400ms") -> None:
        """Task i's link both ways through a token bucket (`tc qdisc ... tbf`: its veth in the root namespace, and eth0
        in its own): a slow link. netem (delay, loss) would be the usual tool, but this kernel has no sch_netem."""
        shape = ["root", "tbf", "rate", rate, "burst", burst, "latency", latency]
        _tc("qdisc", "replace", "dev", self.veth(i), *shape)
        _tc("-n", self.ns(i), "qdisc", "replace", "dev", "eth0", *shape)

    def unlimit(self, i: int) -> None:
        for argv in (
            ["tc", "qdisc", "del", "dev", self.veth(i), "root"],
            ["tc", "-n", self.ns(i), "qdisc", "del", "dev", "eth0", "root"],
        ):
            subprocess.run(argv, capture_output=True, timeout=10)


def wait_until(predicate, timeout, what, poll=0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(poll)
    raise AssertionError(f"{what} did not happen within {timeout} s")


class Tasks:
    """One `python -m runner ... cluster=tf_config` process per task of `jobs` ({"chief": 1, "worker": 2, "ps": 1}),
    task k of the cluster spec in namespace k, each with the TF_CONFIG a Kubernetes operator would give its pod
    (the namespaces' addresses, one port for all). Each task's output goes to <root>/<job>-<i>.out."""

    def __init__(self, netns: NetnsCluster, jobs: dict, argv, root, env: dict, port: int = 2222, pods=None):
        """`pods`: instead of a TF_CONFIG, the pods of a Kubernetes job: pods(job, i) -> (its DNS name, the environment
        Kubernetes gives it); every namespace's /etc/hosts then holds those names, as a headless Service's DNS would."""
        self.names = [f"{job}:{i}" for job, n in jobs.items() for i in range(n)]
        if len(self.names) > netns.n:
            raise ValueError(f"{len(self.names)} tasks need {len(self.names)} namespaces; the cluster has {netns.n}")
        self.netns, self.root = netns, root
        self.ns_of = {name: k for k, name in enumerate(self.names)}
        self.spec = {job: [f"{netns.address(self.ns_of[f'{job}:{i}'])}:{port}" for i in range(n)] for job, n in jobs.items()}
        if pods is not None:
            names = {name: pods(name.partition(":")[0], int(name.partition(":")[2]))[0] for name in self.names}
            netns.hosts({names[name]: netns.address(self.ns_of[name]) for name in self.names})
            self.spec = {job: [f"{names[f'{job}:{i}']}:{port}" for i in range(n)] for job, n in jobs.items()}
        self.procs, self.started = {}, {}
        for name in self.names:
            job, _, index = name.partition(":")
            if pods is not None:
                task_env = dict(env, **pods(job, int(index))[1])
            else:
                task_env = dict(env, TF_CONFIG=json.dumps({"cluster": self.spec, "task": {"type": job, "index": int(index)}}))
            with open(self.out_path(name), "w") as out:
                self.procs[name] = netns.popen(
                    self.ns_of[name], argv(job, int(index)), cwd=root, env=task_env, stdout=out, stderr=subprocess.STDOUT
                )
            self.started[name] = time.monotonic()

    def out_path(self, name):
        return os.path.join(self.root, f"{name.replace(':', '-')}.out")

    def output(self, name) -> str:
        with open(self.out_path(name), errors="replace") as f:
            return f.read()

    def wait_for(self, name, pattern, timeout):
        """The first match of regex `pattern` in task `name`'s output; fails (with the output) after `timeout` s."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = re.search(pattern, self.output(name))
            if found:
                return found
            if self.procs[name].poll() is not None:
                break
            time.sleep(0.2)
        raise AssertionError(f"{pattern!r} not in {name}'s output within {timeout} s:\n{self.output(name)[-3000:]}")

    def finish(self, timeout) -> dict:
        """{task: exit code}, once every task has exited by itself; kills them all and fails after `timeout` s."""
        deadline = time.monotonic() + timeout
        for name, proc in self.procs.items():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill()
                outputs = "\n".join(f"--- {n}\n{self.output(n)[-2000:]}" for n in self.names)
                raise AssertionError(f"{name} did not exit within {timeout} s\n{outputs}") from None
        return {name: proc.returncode for name, proc in self.procs.items()}

    def kill(self):
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
