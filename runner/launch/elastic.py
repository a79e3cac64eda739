"""cluster.elastic: a MultiWorkerMirrored job that loses a worker trains on with the workers that remain
(cluster=localhost, and cluster=ray whose launcher is localhost's with actors: runner.launch.ray_cluster).

TensorFlow fixes a collective group's size when the strategy is made, so the tasks never re-form themselves: the
launcher owns the membership, as torchrun does. When a worker is lost, it stops the survivors (their collectives wait
on the dead peer), writes a TF_CONFIG for the workers that remain (fresh ports) and starts fresh task processes. They
restore the last complete checkpoint and go on in the same MLflow run, with the same global batch: the data position
is the checkpoint's step, so the same examples form the same global batches at any size (runner.builders.data), and
a schedule follows the optimizer's step. Once `rejoin_after_sec` has passed, the lost slot is taken back at the first
checkpoint the smaller job writes: the trainers are stopped with SIGTERM (they checkpoint at a step they agree on)
and the job starts again at its full size.

A trainer preempted (SIGTERM from outside, as a node's preemption notice) makes every trainer checkpoint at a step
they agree on; the job then goes on without it from that checkpoint, no step redone, and grows back as after a loss.

Under parameter_server a lost worker is already rescheduled by the coordinator (cluster.restart_workers); a lost
parameter server, which the coordinator cannot survive, restarts the whole job at the same size from the last
checkpoint, with the same global batch.

What MLflow shows: `cluster/world_size` at each size's first step, `cluster/restarts`, and one record per resize in
the artifact elastic/resizes.json (the lost task and why, the step it was lost at, the checkpoint's step, the steps
redone, how long until the first step at the new size).
"""

import json
import logging
import signal
import time

from omegaconf import OmegaConf

from runner.config import layout
from runner.control import stopping
from runner.errors import ClusterError

log = logging.getLogger("runner")


class TaskLost(ClusterError):
    """A trainer that stopped (killed, crashed, its peers gave up on it), raised by the launcher's supervision
    (runner.launch.localhost): the task, how it ended and its exit code ride along, for the elastic launcher."""

    def __init__(self, message: str, task, note: str, code: int):
        super().__init__(message)
        self.task, self.note, self.code = task, note, code


class TaskPreempted(stopping.Stopped):
    """A trainer exited after a preemption notice (SIGTERM): its peers are stopping too, at the step they agreed on.
    The elastic launcher goes on without the task(s) told; otherwise the job ends KILLED (runner.launch.localhost)."""


class _Grow(Exception):
    """The lost slot's back-off is over and the smaller job has written a checkpoint since it started."""


LOST_CODES = (3, 137)  # a peer lost (ClusterError), or killed by SIGKILL through a shell; and any death by a signal
BLAME_SEC = 0.5  # after a trainer ends: the others that end meanwhile are looked at too, to blame the one killed


def enabled(cfg) -> bool:
    return "elastic" in cfg.cluster.keys() and bool(cfg.cluster.elastic.enabled)


def resized(cfg, workers: int):
    """A copy of the config whose cluster has `workers` workers (the launcher's own: the tasks never see it)."""
    copy = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))
    copy.cluster.workers = workers
    return copy


def job_config(cfg, size: int):
    """A launcher's own view of a multi_worker_mirrored job whose size its cluster tells (Slurm's allocation,
    TF_CONFIG): localhost's cluster fields for `size` workers. The tasks never see it; they are cluster=tf_config."""
    full = resized(cfg, size)
    full.cluster.update(ps=0, chief=False, evaluator=False, restart_workers=0)
    return full


def is_loss(code: int) -> bool:
    """A worker lost (killed, or its peers gave up on it), not an error that would come back at any size (bad input
    exit 2, a blown-up loss 4, broken data 5, a failure 1): those end the job as without elasticity."""
    return code < 0 or code in LOST_CODES


class Membership:
    """The job's size over time, its losses and their records, logged to the job's MLflow run."""

    def __init__(self, cfg, run, room=None, wait_for_room=False):
        self.cfg, self.run, self.room = cfg, run, room  # room(): the workers the cluster can hold now (None: any)
        self.wait_for_room = wait_for_room  # room that may come back (a pod back in touch), not gone for good (Slurm)
        self.full = self.size = int(cfg.cluster.workers)
        self.shrinks = cfg.strategy.name == "multi_worker_mirrored"  # parameter_server: the job restarts at its size
        self.losses, self.records = 0, []
        self.directory = layout.checkpoint_dir(cfg)
        self.started_at = self.job_started = time.monotonic()
        self.base_step = layout.latest_checkpoint_step(self.directory)  # the checkpoint this generation starts from
        self.pending = None  # the record of the last resize, until the new size's first step is seen
        self.logged_through = None  # the last step a generation that ended by itself logged
        self.grown_back_lost = False  # a slot taken back was lost again: the job stays smaller from then on

    def lost(self, err, tasks) -> int:
        """A worker was lost: the size to go on at, or ClusterError (exit 3) past the limits."""
        elastic = self.cfg.cluster.elastic
        self.losses += 1
        left = self.size - 1 if self.shrinks else self.size
        if self.losses > elastic.max_restarts:
            limit = f"this is loss {self.losses}, past max_restarts={elastic.max_restarts}"
            raise ClusterError(f"{err} (cluster.elastic: {limit})")
        if left < elastic.min_workers and self.shrinks:
            limit = f"{left} worker(s) would be left, below min_workers={elastic.min_workers}"
            raise ClusterError(f"{err} (cluster.elastic: {limit})")
        self._resize(left, f"lost {err.task.name}: {err.note}", tasks[0].step)
        return left

    def preempted(self, told, tasks) -> int | None:
        """Trainers were preempted and every trainer checkpointed at the step they agreed on: the size to go on at
        without them, or None (nobody was told, or past the limits: the job ends KILLED, as without elasticity)."""
        elastic = self.cfg.cluster.elastic
        left = self.size - len(told)
        if not told or not self.shrinks or self.losses >= elastic.max_restarts or left < elastic.min_workers:
            return None
        self.losses += 1
        self._resize(left, f"{', '.join(t.name for t in told)} preempted (SIGTERM)", tasks[0].step)
        return left

    def _going_on(self, size: int) -> str:
        return f"going on with {size} worker(s)" if self.shrinks else f"restarting every task ({size} worker(s))"

    def delivered(self, step) -> None:
        """A generation ended by itself at `step` (its metrics were delivered): the next one does not log it again."""
        if step is not None:
            self.logged_through = max(self.logged_through or 0, step)

    def _resize(self, size: int, why: str, at_step) -> None:
        self.close_open()
        if size < self.size == self.full and self.records and self.records[-1]["to_workers"] == self.full:
            self.grown_back_lost = True  # a slot lost again after growing back: no flapping
        checkpoint = layout.latest_checkpoint_step(self.directory) or 0
        self.pending = {
            "from_workers": self.size,
            "to_workers": size,
            "why": why,
            "at_step": at_step,
            "checkpoint_step": checkpoint,
            "steps_redone": max(0, at_step - checkpoint) if at_step is not None else None,
            "detected_at": time.time(),
        }
        self._started = time.monotonic()
        at = at_step if at_step is not None else "?"
        if size > self.size:  # good news, and the step is not known yet: the trainers agree on it when told to stop
            log.info("cluster.elastic: %s at step %s; the trainers checkpoint at a step they agree on", why, at)
        else:
            log.warning(
                "cluster.elastic: %s at step %s; %s from the checkpoint at step %d", why, at, self._going_on(size), checkpoint
            )
        self.size, self.base_step, self.started_at = size, checkpoint, time.monotonic()

    def grow(self, at_step) -> int:
        self._resize(self.full, "the lost worker's slot is back", at_step)
        return self.full

    def summary(self) -> str:
        """One line for the job's end: what its losses cost."""
        redone = sum(r["steps_redone"] or 0 for r in self.records)
        lost = f"{self.losses} worker loss(es)" if self.losses else "no worker lost"
        took = time.monotonic() - self.job_started
        return (
            f"cluster.elastic: {lost}, {len(self.records)} resize(s), {redone} step(s) redone; the job ended at "
            f"{self.size} worker(s), {took:.1f}s over {len(self.records) + 1} generation(s) (each task's done: line is "
            "its own generation's)"
        )

    def close_open(self, resize_sec=None) -> None:
        """The open record, into the run: with its time to the first step at the new size, or None (never seen)."""
        if self.pending is None:
            return
        record, self.pending = {**self.pending, "resize_sec": resize_sec}, None
        self.records.append(record)
        self._send(
            lambda: (
                self.run.log_metrics(
                    {"cluster/world_size": float(record["to_workers"]), "cluster/restarts": float(self.losses)},
                    record["checkpoint_step"],
                ),
                self.run.set_tags({"cluster.elastic.resizes": str(len(self.records))}),
                self.run.log_text(json.dumps(self.records, indent=1), "elastic/resizes.json"),
            )
        )

    def _send(self, call) -> None:
        """MLflow must not stall or end the supervision: a failure is a warning (the run's values are queued)."""
        try:
            call()
        except Exception as err:  # noqa: BLE001
            log.warning("cluster.elastic: could not record the resize in MLflow (%s)", err)

    def tick(self, tasks) -> None:
        """At every poll: the first step at a new size closes its record; a smaller job that may grow back does so
        at its first checkpoint after the back-off (not at the job's last step, not once a trainer has finished)."""
        chief = tasks[0]
        if self.pending is not None and chief.step is not None and chief.step > self.pending["checkpoint_step"]:
            sec = round(time.monotonic() - self._started, 3)
            self.close_open(sec)
            log.info("cluster.elastic: training again on %d worker(s), %.1fs after the resize", self.size, sec)
        back_off = self.cfg.cluster.elastic.rejoin_after_sec
        if self.size == self.full or back_off is None or self.grown_back_lost:
            return
        if time.monotonic() - self.started_at < back_off or any(t.proc.poll() == 0 for t in tasks):
            return
        newest = layout.latest_checkpoint_step(self.directory)
        final = chief.last_step
        if newest is not None and newest > (self.base_step or 0) and (final is None or newest < final):
            if self.room is not None and self.room() < self.full:
                if self.wait_for_room:  # the lost pod is not back in touch yet: asked again at the next poll
                    return
                self.grown_back_lost = True  # the lost slot's node is gone (Slurm)
                log.warning(
                    "cluster.elastic: the cluster has no room for %d workers any more; staying at %d", self.full, self.size
                )
                return
            raise _Grow()


def _heard_out(tasks) -> None:
    """Every line the stopped tasks wrote, read: the chief's step is that of its last progress line, not of one its
    output reader had not reached yet (the next generation would log the steps between again)."""
    for t in tasks:
        for pump in t.pumps:
            pump.join(timeout=2)


def is_killed(code: int | None) -> bool:
    """Ended by a signal (or exit 137, SIGKILL through a shell), not by giving up on a lost peer (exit 3)."""
    return code is not None and (code < 0 or code == 137)


def killed(tasks):
    """(the first task that has ended killed, its exit code), or None."""
    for t in tasks:
        code = t.proc.poll()
        if is_killed(code):
            return t, code
    return None


def _blamed(err, tasks):
    """The trainer to blame: one that died by a signal (killed) rather than a peer that gave up on it (exit 3),
    looked for among those that ended within BLAME_SEC of the first (a parameter server among them)."""
    time.sleep(BLAME_SEC)
    found = None if is_killed(err.code) else killed(tasks)
    if found is None:
        return err
    t, code = found
    note = t.exit_note(code)
    return TaskLost(f"task {t.name} (pid {t.proc.pid}) stopped: {note}. Its log is in {t.run_dir}/runner.log.", t, note, code)


def supervise(
    tasks: list, cfg, rebuild, run, supervise_one, stop_all, trainers, wait_for, room=None, wait_for_room=False
) -> None:
    """Run the job through its resizes. `tasks` is updated in place (the caller stops whatever it holds at the end);
    rebuild(workers) makes the tasks of a job of that size; supervise_one(tasks, cfg, tick) is the launcher's
    supervision of one set, which raises TaskLost for a lost trainer; stop_all, trainers and wait_for are the
    launcher's own (runner.launch.localhost); room(), where given, says how many workers the cluster can hold now
    (cluster=slurm: the slots on the nodes the job still has), asked before growing back; with `wait_for_room`, room
    that is short is asked again later (cluster=tf_config's pods come back in touch), not given up on."""

    membership = Membership(cfg, run, room, wait_for_room)
    try:
        _supervise(membership, tasks, cfg, rebuild, run, supervise_one, stop_all, trainers, wait_for)
    finally:  # however the job ended (its last step, past the limits, a stop): what its losses cost
        if membership.records or membership.losses:
            log.info(membership.summary())


def _supervise(membership, tasks, cfg, rebuild, run, supervise_one, stop_all, trainers, wait_for) -> None:
    from runner.control import contract

    membership._send(
        lambda: run.log_metrics(
            {"cluster/world_size": float(membership.size), "cluster/restarts": 0.0}, membership.base_step or 0
        )
    )
    while True:
        try:
            supervise_one(tasks, cfg, tick=lambda: membership.tick(tasks))
            membership.close_open()
            return
        except TaskLost as first:
            err = _blamed(first, tasks)
            if not is_loss(err.code):  # an error that would come back at any size: the job ends as without elasticity
                membership.close_open()
                raise ClusterError(str(err)) from None
            chief = tasks[0]
            ended_by_itself = chief.proc.poll() is not None and chief.proc.returncode >= 0  # its metrics were delivered
            for t in tasks:  # the survivors' collectives wait on the lost peer: nothing to save, stop them now
                t.signal(signal.SIGKILL)
            for t in tasks:
                t.proc.wait()
            _heard_out(tasks)
            size = membership.lost(err, tasks)  # after they are gone: the checkpoint named is the one restored
            if ended_by_itself:
                membership.delivered(chief.step)
        except TaskPreempted:
            wait_for(trainers(tasks), cfg.cluster.stop_grace_sec)  # they are checkpointing at the step they agreed on
            told = [t for t in trainers(tasks) if t.notified]
            stop_all(tasks, cfg.cluster.failure_grace_sec)
            _heard_out(tasks)
            if all(t.proc.returncode == 0 for t in trainers(tasks)):  # they reached the last step before they stopped
                membership.close_open()
                return
            size = membership.preempted(told, tasks)
            if size is None:
                membership.close_open()
                raise
            membership.delivered(tasks[0].step)
        except _Grow:
            size = membership.grow(tasks[0].step)
            for t in trainers(tasks):  # they checkpoint at a step they agree on, then exit
                t.signal(signal.SIGTERM)
            wait_for(trainers(tasks), cfg.cluster.stop_grace_sec)
            stop_all(tasks, cfg.cluster.failure_grace_sec)
            _heard_out(tasks)
            if all(t.proc.returncode == 0 for t in trainers(tasks)):  # they reached the last step before they stopped
                membership.pending = None
                log.info("cluster.elastic: the job reached its last step before it could grow back")
                return
            step = layout.latest_checkpoint_step(membership.directory) or 0  # the one they wrote on SIGTERM
            membership.pending.update(checkpoint_step=step, steps_redone=0)
            membership.base_step = step
            log.info("cluster.elastic: going on with %d worker(s) from the checkpoint at step %d", size, step)
            membership.delivered(tasks[0].step)  # they ended by themselves
        tasks[:] = rebuild(size)
        if membership.logged_through is not None:
            for t in tasks:
                t.env[contract.LOGGED_THROUGH] = str(membership.logged_through)
