"""runner.tracking.runlog.RunLog: what training logged is delivered when training ends, not at the run's close."""

import threading

from runner.tracking.runlog import RunLog


class Client:
    """MlflowClient's calls RunLog makes, recorded; `taken` is set at each log_batch."""

    def __init__(self):
        self.batches, self.ended, self.taken = [], [], threading.Event()

    def log_batch(self, run_id, metrics=(), tags=(), params=()):
        self.batches.append([m[:2] for m in metrics])
        self.taken.set()

    def set_terminated(self, run_id, status):
        self.ended.append(status)


def test_deliver_soon_sends_what_is_queued_without_waiting_for_the_period_or_the_close():
    client = Client()
    run = RunLog(client, "r", "sqlite:///x.db", flush_every=1000.0)
    run.log_metrics({"loss": 0.5}, 10)
    assert not client.taken.wait(1.5)  # past the journal's second: nothing is sent before its period
    run.deliver_soon()
    assert client.taken.wait(5.0) and client.batches == [[("loss", 0.5)]]
    run.close("FINISHED")
    assert client.batches == [[("loss", 0.5)]] and client.ended == ["FINISHED"]  # sent once


class Deleting(Client):
    """A store that deletes runs (`deletes`: what Calls.delete_run answers), or is unreachable (`down`)."""

    def __init__(self, deletes=True, down=False):
        super().__init__()
        self.deletes, self.down, self.deleted = deletes, down, []

    def delete_run(self, run_id):
        if self.down:
            raise ConnectionError("Connection refused")
        self.deleted.append(run_id)
        return self.deletes


def test_close_deleted_deletes_the_run_or_says_it_could_not(tmp_path):
    from runner.tracking import outbox
    from runner.tracking.runlog import DELETED

    client = Deleting()
    run = RunLog(client, "r", "sqlite:///x.db", outbox_dir=str(tmp_path / "a"))
    assert run.close(DELETED) and run.deleted and client.deleted == ["r"] and client.ended == []
    refusing = Deleting(deletes=False)  # the store ended it FAILED but would not delete it
    run = RunLog(refusing, "r", "sqlite:///x.db", outbox_dir=str(tmp_path / "b"))
    assert run.close(DELETED) and not run.deleted
    down = Deleting(down=True)  # unreachable: kept FAILED in the outbox, for `python -m runner.deliver`
    run = RunLog(down, "r", "sqlite:///x.db", delivery_timeout=0.0, outbox_dir=str(tmp_path / "c"))
    run.set_tags({"error": "ConfigError: bad"})
    assert not run.close(DELETED) and not run.deleted
    with open(outbox.path_in(str(tmp_path / "c"))) as f:
        assert '"status": "FAILED"' in f.read()


class Broken(Client):
    """A local store whose file went away under the run: every write fails as SQLite's does then."""

    def log_batch(self, run_id, metrics=(), tags=(), params=()):
        raise RuntimeError("(sqlite3.OperationalError) attempt to write a readonly database")


def test_a_local_store_deleted_under_the_run_is_not_waited_for(tmp_path):
    """Its file does not come back by itself: what is left goes to the outbox at once, not after
    mlflow.delivery_timeout_sec (a server that is down is waited for: test_close_deleted_... above)."""
    import time

    from runner.tracking import outbox
    from runner.tracking.runlog import local_store_gone

    store = tmp_path / "mlflow.db"
    store.write_bytes(b"")
    assert not local_store_gone(f"sqlite:///{store}") and not local_store_gone("http://host:5000")
    store.unlink()
    assert local_store_gone(f"sqlite:///{store}")
    run = RunLog(Broken(), "r", f"sqlite:///{store}", delivery_timeout=120.0, outbox_dir=str(tmp_path / "out"))
    run.log_metrics({"loss": 0.5}, 1)
    started = time.monotonic()
    assert not run.close("FINISHED")
    assert time.monotonic() - started < 20 and (tmp_path / "out" / "mlflow_outbox.jsonl").exists()
    assert outbox.path_in(str(tmp_path / "out")).endswith("mlflow_outbox.jsonl")
