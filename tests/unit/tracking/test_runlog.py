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
