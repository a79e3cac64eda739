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
