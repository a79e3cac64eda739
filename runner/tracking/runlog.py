"""One MLflow run as the training process sees it: metrics and tags queued, journaled, delivered in batches.

`RunLog` takes any client with MlflowClient's log_batch / set_terminated / log_artifact / log_text that accepts
plain lists for entities: runner.tracking.pipe (the MLflow process) in a run, `mlflow_process.Calls` in
process. `NullRun` is what a task that does not log reports to.
"""

import logging
import os
import threading
import time

from runner.config.redact import error_line, redact, redact_mapping, redact_uri
from runner.errors import RunnerError
from runner.tracking import journal, outbox

METRICS_PER_BATCH = 1000  # MLflow's log_batch limit
FLUSH_EVERY_SEC = 5.0  # mlflow.flush_every_sec (runner.config.schema)
JOURNAL_EVERY_SEC = 1.0  # what a kill -9 can lose at most
DELETED = "DELETED"  # close()'s status for a run refused before its first step (runner.tracking.run): not MLflow's

log = logging.getLogger("runner")


def local_store_gone(uri: str) -> bool:
    """Whether a local SQLite store's file was deleted, or it or its directory made read-only, under the run:
    waiting for it is waiting for nothing, so what is left goes to the outbox at once."""
    if not uri.startswith("sqlite:///"):
        return False
    path = uri[len("sqlite:///") :].split("?", 1)[0]
    if not path or path == ":memory:":
        return False
    path = os.path.abspath(path)
    writable = os.access(path, os.W_OK) and os.access(os.path.dirname(path), os.W_OK)  # SQLite writes its journal beside
    return not os.path.isfile(path) or not writable


class RunLog:
    """One MLflow run. Metrics and tags are queued and sent by a background thread with log_batch, so neither
    logging nor an unreachable server ever stalls training: undelivered values stay queued and are retried.
    close() delivers the rest (waiting up to mlflow.delivery_timeout_sec for a server that is down) and, if
    the server never comes back, saves them to an outbox file that `python -m runner.deliver` sends later."""

    def __init__(
        self,
        client,
        run_id: str,
        uri: str,
        owner: bool = True,
        flush_every: float = FLUSH_EVERY_SEC,
        delivery_timeout: float = 120.0,
        outbox_dir: str | None = None,
        logged_through: int | None = None,
        experiment_id: str | None = None,
        previous_status: str | None = None,
        put_back: dict | None = None,
        earlier: dict | None = None,
    ):
        self._client, self.run_id, self.tracking_uri, self.experiment_id = client, run_id, uri, experiment_id
        self.previous_status = previous_status  # a continued run's status before this attempt (None: a new run)
        self.put_back = put_back or {}  # and the tags this attempt changed, as they were (a refusal restores them)
        self.deleted = False  # close(DELETED) deleted it
        self.owner = owner  # False when attached to the launcher's run: the launcher ends it
        self.flush_every, self.delivery_timeout, self.outbox_dir = flush_every, delivery_timeout, outbox_dir
        self._metrics, self._tags = [], []
        # Steps an earlier, killed attempt already logged (its journal was delivered): not logged twice.
        self.logged_through = logged_through
        self.earlier = earlier  # a continued run's figures so far (store.earlier_figures); None for a new run
        self.last_step: int | None = None  # the last step metrics were logged at (named when the data breaks)
        self._fresh = []  # values logged since the last journal write
        self._journal = journal.Journal(outbox_dir, logged_through) if outbox_dir else None
        self._journaled = self._delivered = 0  # values written to the journal / taken by the store, in order
        self._lock, self._sending = threading.Lock(), threading.Lock()
        # Journal writes have their own lock: a checkpoint's sync_journal must not wait behind a delivery that a
        # slow or unreachable server holds up (MLflow's HTTP retries take minutes).
        self._journaling = threading.Lock()
        self._wake, self._stop = threading.Event(), threading.Event()
        self._last_flush = time.monotonic()
        self._outage = None  # why the last delivery failed, while it keeps failing
        self._thread = threading.Thread(target=self._send_loop, name="mlflow-sender", daemon=True)
        self._thread.start()
        self._side: list[threading.Thread] = []  # calls nothing waits for (log_inputs), joined by close()

    def log_metrics(self, values: dict[str, float], step: int) -> None:
        # Plain (key, value, timestamp, step) tuples: the cheapest thing to make on the training thread.
        now = int(time.time() * 1000)
        step = self.last_step = int(step)
        if self.logged_through is not None and step <= self.logged_through:
            return
        self._queue(values, now, step)

    def log_end(self, values: dict[str, float], step: int) -> None:
        """The run's end figures (evaluation, summary) at `step`, even where an earlier attempt logged the steps
        up to it: an attempt that resumed at the last step trains nothing, but ends the run all the same."""
        self._queue(values, int(time.time() * 1000), int(step))

    def _queue(self, values: dict[str, float], now: int, step: int) -> None:
        rows = [(k, float(v), now, step) for k, v in values.items()]
        with self._lock:
            self._metrics.extend(rows)
            self._fresh.extend(rows)

    def set_tags(self, tags: dict[str, object]) -> None:
        with self._lock:
            self._tags.extend((k, str(v)[:5000]) for k, v in redact_mapping({k: str(v) for k, v in tags.items()}).items())
        self._wake.set()

    def flush(self) -> bool:
        """Send what is queued now; False if the server could not take it (it stays queued)."""
        return self._deliver()

    def deliver_soon(self) -> None:
        """Training has ended: the sender delivers what is queued now, beside the evaluation and the save, instead
        of at its next period or in close(), which the command waits for."""
        ended = getattr(self._client, "training_ended", None)  # the MLflow process's pipe: every call is waited for now
        if ended is not None:
            ended()
        self._wake.set()

    def _send_loop(self) -> None:
        """Journal what was logged every JOURNAL_EVERY_SEC; deliver it every mlflow.flush_every_sec (or when woken)."""
        while not self._stop.is_set():
            woken = self._wake.wait(min(JOURNAL_EVERY_SEC, self.flush_every))
            if woken:  # cleared only when seen: a wake set after a timed-out wait is kept for the next turn
                self._wake.clear()
            if self._stop.is_set():
                break
            if woken or time.monotonic() - self._last_flush >= self.flush_every:
                self._deliver()
            else:
                self._write_journal()

    def sync_journal(self) -> None:
        """Journal everything logged so far, now (before a checkpoint is written)."""
        self._write_journal()

    def _write_journal(self) -> None:
        """Append the values logged since the last call to the journal."""
        with self._journaling:
            with self._lock:
                rows, self._fresh = self._fresh, []
            if self._journal is not None and rows:
                try:
                    self._journal.append(rows)
                except OSError as err:  # a full disk must not stop training: the values are still queued for MLflow
                    log.warning(
                        "could not write the metrics journal %s (%s); metrics still go to MLflow", self._journal.path, err
                    )
                    self._journal = None
            self._journaled += len(rows)

    def _deliver(self) -> bool:
        """Send queued tags and metrics in log_batch calls of up to 1000 values, oldest first.

        The store's work is done in the MLflow process, but each delivery still costs this process some
        encoding: the sender wakes at most every mlflow.flush_every_sec during training.
        """
        with self._sending:
            self._last_flush = time.monotonic()
            self._write_journal()  # what is delivered is journaled first, so the journal's count lines up
            while True:
                with self._lock:
                    room = min(METRICS_PER_BATCH - min(len(self._tags), 100), self._journaled - self._delivered)
                    tags, metrics = self._tags[:100], self._metrics[:room]
                if not tags and not metrics:
                    break
                try:
                    self._client.log_batch(self.run_id, metrics=metrics, tags=tags)
                except Exception as err:  # connection refused, timeouts, 5xx after MLflow's own retries
                    self._note_outage(err)
                    return False
                with self._lock:
                    del self._tags[: len(tags)], self._metrics[: len(metrics)]
                self._delivered += len(metrics)
                with self._journaling:
                    if self._journal is not None and metrics:
                        try:
                            self._journal.delivered(self._delivered)
                        except OSError:
                            self._journal = None
                if self._outage is not None:
                    log.warning(
                        "MLflow at %s is reachable again; delivering the metrics kept meanwhile", redact_uri(self.tracking_uri)
                    )
                    self._outage = None
            return True

    def _note_outage(self, err: Exception) -> None:
        why = error_line(err)
        if self._outage is None:
            log.warning(
                "MLflow at %s cannot take metrics now (%s); training goes on, %d value(s) kept here and retried every %gs",
                redact_uri(self.tracking_uri),
                why,
                self.pending,
                self.flush_every,
            )
        self._outage = why

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._metrics) + len(self._tags)

    def log_inputs(self, datasets: list[dict]) -> None:
        """The run's datasets (runner.sources.description), logged in the background: training does not wait."""
        if not datasets:
            return

        def send():
            try:
                self._client.log_inputs(self.run_id, datasets)
            except Exception as err:
                log.warning("could not log the run's datasets to MLflow (%s)", redact(str(err).strip())[:300])

        thread = threading.Thread(target=send, name="mlflow-inputs", daemon=True)
        thread.start()
        self._side.append(thread)

    def log_model(self, keras_path: str, **args) -> dict:
        """The saved model as an MLflow model (runner.mlflow_process.ops); raises what the MLflow process raised, or at once
        while the store is unreachable (each of its calls would wait out MLflow's retries)."""
        if self._outage is not None:
            raise RuntimeError(f"MLflow at {redact_uri(self.tracking_uri)} is unreachable ({self._outage})")
        return self._client.log_model(self.run_id, keras_path, **args)

    def close(self, status: str | None) -> bool:
        """Deliver everything, then end the run with `status` (None: leave it to its owner; DELETED: end it FAILED and
        delete it). Returns whether the store took it all, status included (else it is in the outbox)."""
        for thread in self._side:
            thread.join(self.delivery_timeout)
        self._stop.set()
        self._wake.set()
        self._thread.join()
        deadline = time.monotonic() + self.delivery_timeout
        try:
            while not self._deliver_all(status):
                left = deadline - time.monotonic()
                if left <= 0 or local_store_gone(self.tracking_uri):  # a deleted local file does not come back
                    break
                if self._outage:
                    log.warning(
                        "waiting up to %.0fs more for MLflow at %s to take %d value(s) (mlflow.delivery_timeout_sec)",
                        left,
                        redact_uri(self.tracking_uri),
                        self.pending,
                    )
                time.sleep(min(5.0, left))
            else:
                if self._journal is not None:  # everything is in the store: the journal has done its job
                    self._journal.close(remove=True)
                return True
        except (KeyboardInterrupt, RunnerError):  # a second Ctrl-C (Stopped, while training's handler is in place)
            pass  # stop waiting, keep what is left in the outbox
        # A run to delete is kept FAILED there: deleting is for a store that answers now, not for a later delivery.
        kept = "FAILED" if status == DELETED else status
        path = outbox.save(self.outbox_dir or os.getcwd(), self.run_id, self._metrics, self._tags, kept if self.owner else None)
        gone = local_store_gone(self.tracking_uri)
        log.error(
            "MLflow at %s %s: %d value(s) of run %s are saved in %s. Send them with "
            "`python -m runner.deliver %s` once it is up (a rerun with resume= does it too).",
            redact_uri(self.tracking_uri),
            "was deleted or made read-only during the run" if gone else "did not come back",
            self.pending,
            self.run_id,
            path,
            os.path.dirname(path),
        )
        return False

    def _deliver_all(self, status: str | None) -> bool:
        if not self._deliver():
            return False
        if status and self.owner:
            try:
                if status == DELETED:
                    self.deleted = bool(self._client.delete_run(self.run_id))
                else:
                    self._client.set_terminated(self.run_id, status)
            except Exception as err:
                self._note_outage(err)
                return False
        return True

    def log_artifact(self, path: str, artifact_path: str | None = None) -> None:
        try:
            self._client.log_artifact(self.run_id, path, artifact_path)
        except Exception as err:  # the file stays on disk; say where
            log.warning(
                "could not upload %s to MLflow (%s); it stays at %s", os.path.basename(path), redact(str(err))[:200], path
            )

    def log_text(self, text: str, name: str) -> None:
        self._client.log_text(self.run_id, redact(text), name)


class NullRun:
    """What a non-chief task reports to: nothing, so each metric is logged once per cluster."""

    run_id = last_step = earlier = tracking_uri = None

    def log_metrics(self, values, step):
        pass

    def log_end(self, values, step):
        pass

    def flush(self):
        pass

    def deliver_soon(self):
        pass

    def sync_journal(self):
        pass

    def set_tags(self, tags):
        pass

    def log_artifact(self, path, artifact_path=None):
        pass

    def log_text(self, text, name):
        pass

    def log_inputs(self, datasets):
        pass

    def log_model(self, keras_path, **args):
        return None

    def close(self, status):
        return True
