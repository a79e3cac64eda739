"""The wire between the agents of an elastic cluster=tf_config job (runner.launch.pods): JSON lines over TCP.

worker:0's agent listens on its TF_CONFIG address (the `Hub`); every other agent connects to it (`connect`). Both
ends send a heartbeat every BEAT_SEC, and a side that hears nothing for cluster.agent_timeout_sec takes the other as
lost (a link down, a pod gone): TCP alone would wait minutes for a dead peer. No TensorFlow here.
"""

import contextlib
import hashlib
import json
import logging
import socket
import threading
import time

log = logging.getLogger("runner")
BEAT_SEC = 0.5


def job_token(spec: dict) -> str:
    """Who belongs to this job: a digest of its TF_CONFIG cluster (an agent of another job is turned away)."""
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


class Channel:
    """One connection. `on_message(channel, message)` for each message (heartbeats too), from its reader thread;
    `on_close(channel, why)` once, when it closes (by either side, or silence for `lost_sec`); `beat()`: what each
    heartbeat carries."""

    def __init__(self, sock: socket.socket, on_message, on_close, lost_sec: float, beat):
        self.sock, self.on_message, self.on_close, self.lost_sec, self.beat = sock, on_message, on_close, lost_sec, beat
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(BEAT_SEC)  # a send into a dead link fails within this, as a read wakes up to check the silence
        self.heard = time.monotonic()
        self.closed = None  # why it closed
        self._lock = threading.Lock()
        host, port = sock.getpeername()[:2]
        self.peer = f"{host}:{port}"
        self._threads = [
            threading.Thread(target=f, daemon=True, name=f"rendezvous-{f.__name__}") for f in (self._read, self._beat)
        ]

    def start(self) -> "Channel":
        for t in self._threads:
            t.start()
        return self

    def send(self, message: dict) -> bool:
        """False when the channel is closed (or closes now, the send having failed)."""
        data = (json.dumps(message) + "\n").encode()
        with self._lock:
            if self.closed:
                return False
            try:
                self.sock.sendall(data)
                return True
            except OSError as err:
                failed = f"a send failed ({err or 'timed out'})"
        self.close(failed)
        return False

    def close(self, why: str) -> None:
        with self._lock:
            if self.closed:
                return
            self.closed = why
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        try:
            self.on_close(self, why)
        except Exception as err:  # noqa: BLE001  (a callback's bug must not end the thread that closes)
            log.warning("rendezvous: after closing %s: %s: %s", self.peer, type(err).__name__, err)

    def _beat(self) -> None:
        while not self.closed and self.send({"beat": self.beat()}):
            time.sleep(BEAT_SEC)

    def _read(self) -> None:
        buffer = b""
        while not self.closed:
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError:
                silent = time.monotonic() - self.heard
                if silent > self.lost_sec:
                    self.close(f"no word for {silent:.1f}s")
                continue
            except OSError as err:
                self.close(f"the connection failed ({err})")
                return
            if not chunk:
                self.close("the connection was closed")
                return
            self.heard = time.monotonic()
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                try:
                    message = json.loads(line)
                    self.on_message(self, message)
                except Exception as err:  # noqa: BLE001  (a stranger's bytes, a message without what it needs)
                    self.close(f"not this job's protocol: {line[:80]!r} ({type(err).__name__})")
                    return


class Hub:
    """worker:0's end: agents say hello with their index and job token, then stay connected. `on_message(index,
    message)` and `on_lost(channel, why)` are the launcher's; `room()` is how many workers the job could run now."""

    def __init__(self, port: int, size: int, token: str, lost_sec: float, on_message, on_lost):
        self.size, self.token, self.lost_sec = size, token, lost_sec
        self.on_message, self.on_lost = on_message, on_lost
        self.agents: dict[int, Channel] = {}
        self.ports: dict[int, int] = {}  # each agent's latest free port, from its heartbeats
        self.leaving: set[int] = set()  # agents stopping (their pod's SIGTERM): not given a place in the next generation
        self._lock = threading.Lock()
        self._joined = threading.Condition(self._lock)
        self.server = socket.create_server(("", port))
        self.server.settimeout(BEAT_SEC)
        self.open = True
        threading.Thread(target=self._accept, daemon=True, name="rendezvous-accept").start()

    def _accept(self) -> None:
        while self.open:
            try:
                sock, _ = self.server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:  # a client gone at once (a probe, a port scan) must not end the accepting
                channel = Channel(sock, self._message, self._closed, self.lost_sec, beat=lambda: 1)
            except OSError:
                sock.close()
                continue
            channel.index = channel.agent = None
            channel.start()

    def _message(self, channel: Channel, message: dict) -> None:
        if channel.index is None:
            hello = message.get("hello")
            index = hello.get("index") if isinstance(hello, dict) else None
            port = hello.get("port") if isinstance(hello, dict) else None
            valid = isinstance(index, int) and 0 < index < self.size and isinstance(port, int)
            if not isinstance(hello, dict) or hello.get("token") != self.token or not valid:
                stranger = isinstance(hello, dict) and hello.get("token") != self.token
                why = "its TF_CONFIG names another cluster" if stranger else "no worker index of this job"
                log.warning("rendezvous: turned away %s (%s: %s)", channel.peer, why, str(message)[:200])
                channel.send({"refused": why})
                channel.close("turned away")
                return
            agent = str(hello.get("agent", ""))
            with self._lock:
                old = self.agents.get(index)
                other = old is not None and old.agent != agent and index not in self.leaving
                if other and time.monotonic() - old.heard < self.lost_sec:  # another pod in touch with this index
                    busy = f"worker:{index}'s place is taken by another agent in touch (from {old.peer})"
                else:
                    busy = None
                    channel.index, channel.agent, self.agents[index] = index, agent, channel
                    self.leaving.discard(index)
                    self.ports[index] = port
                    self._joined.notify_all()
            if busy:
                channel.send({"refused": busy, "retry": True})
                channel.close("turned away: its index is in touch")
                return
            channel.send({"welcome": index})
            if old is not None:
                old.close("replaced by a new connection of the same agent" if not other else "replaced: it was silent")
            log.info("rendezvous: worker:%d's agent joined from %s", index, channel.peer)
            return
        if "beat" in message:
            if isinstance(message["beat"], int):
                self.ports[channel.index] = message["beat"]
            return
        if "leaving" in message:
            with self._lock:
                self.leaving.add(channel.index)
            log.info("rendezvous: worker:%d's agent is stopping", channel.index)
            return
        self.on_message(channel.index, message)

    def _closed(self, channel: Channel, why: str) -> None:
        if channel.index is None:
            return
        with self._lock:
            if self.agents.get(channel.index) is channel:
                del self.agents[channel.index]
        self.on_lost(channel, why)

    def live(self) -> list[int]:
        """The agents in touch that are not stopping."""
        with self._lock:
            return sorted(set(self.agents) - self.leaving)

    def channel(self, index: int) -> Channel | None:
        with self._lock:
            return self.agents.get(index)

    def room(self) -> int:
        """worker:0 and the agents connected now."""
        return 1 + len(self.live())

    def wait_for_all(self, timeout: float) -> list[int]:
        """The indexes still missing after up to `timeout` s ([] once every agent has joined)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while len(self.agents) < self.size - 1 and time.monotonic() < deadline:
                self._joined.wait(min(1.0, max(0.0, deadline - time.monotonic())))
            return [i for i in range(1, self.size) if i not in self.agents]

    def finish(self, result: dict) -> None:
        """The job has ended: every agent connected is told (`result`: ok, error), then the hub closes."""
        self.open = False
        with self._lock:
            channels = list(self.agents.values())
        for channel in channels:
            channel.send({"done": result})
        for channel in channels:
            channel.close("the job has ended")
        self.server.close()


def connect(address: str, lost_sec: float, on_message, on_close, beat) -> Channel | None:
    """A channel to worker:0's hub at `address` (host:port), or None when it does not answer now."""
    host, _, port = address.rpartition(":")
    try:
        sock = socket.create_connection((host, int(port)), timeout=2.0)
    except OSError:
        return None
    return Channel(sock, on_message, on_close, lost_sec, beat=beat)
