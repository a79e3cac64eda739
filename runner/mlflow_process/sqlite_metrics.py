"""Metric values into a local SQLite store in one transaction per batch (one `executemany`, and the latest value per
key): the rows MLflow's `log_batch` writes, without its ORM's unit of work, which costs 0.1 ms of CPU per value. On 2
cores that CPU comes out of training's steps: a 30 000-step run logs 15 000 values or more (docs/dev/benchmarks-wall.md).

The one place the runner writes MLflow's tables (its private schema, read from the installed MLflow's own table
definitions, `mlflow==3.17.*` pinned). What it writes is what `SqlAlchemyStore._log_metrics` writes:
- one `metrics` row per value, a value already there ignored (the primary key covers every column);
- NaN stored as 0 with `is_nan`, +/-inf as +/- the largest finite float;
- `latest_metrics`, per run and key, the value with the largest (step, timestamp, value); of equals, the one stored
  first.

MLflow's own `log_batch` still does the rest, and is the fallback for anything unusual:
- the first value of each key in a run, so that MLflow validates the key's name, and the batch's tags with it;
- a run that is missing or deleted, so that the caller gets MLflow's own error;
- a batch that is not what RunLog sends (a value that is not a number, a step or timestamp that is not an int, more
  than 1000 values), and every batch while an MLflow active model is set (MLflow copies values to the model);
- a store this module cannot use: not SQLite, or an MLflow without these table definitions.
tests/unit/mlflow_process/test_sqlite_metrics.py compares what both paths leave in the store, as MLflow reads it back.
"""

import logging
import math

from runner.mlflow_process.delivery import BATCH  # MLflow's log_batch limit
from runner.preflight.sqlite_store import sqlite_path

log = logging.getLogger("runner")
LARGEST = 1.7976931348623157e308  # what MLflow stores for +/-inf (SQL has no infinity)
LOCK_WAIT_SEC = 20.0


class SqliteMetrics:
    """Writes metric values of runs in the SQLite store `uri`; `for_uri` gives None for other stores."""

    def __init__(self, uri: str):
        import sqlalchemy
        from mlflow.store.tracking.dbmodels.models import SqlLatestMetric, SqlMetric, SqlRun
        from sqlalchemy.dialects.sqlite import insert

        self._sa = sqlalchemy
        self._metrics, self._latest, self._runs = SqlMetric.__table__, SqlLatestMetric.__table__, SqlRun.__table__
        self._insert = insert(self._metrics).on_conflict_do_nothing()
        # MLflow's sessions wait 20 s for SQLite's lock (PRAGMA busy_timeout), not pysqlite's 5 s. Its foreign_keys=ON
        # is not copied: a missing run is told by the run's row, below.
        self._engine = sqlalchemy.create_engine(uri, pool_pre_ping=True, connect_args={"timeout": LOCK_WAIT_SEC})
        self._known: dict[str, set] = {}  # run id -> keys MLflow has taken (validated) for it

    @classmethod
    def for_uri(cls, uri: str) -> "SqliteMetrics | None":
        if sqlite_path(uri) is None:
            return None
        try:
            return cls(uri)
        except Exception as err:  # an MLflow without these tables or names: its log_batch does all the work
            log.debug("metric values go through MLflow's log_batch (%s: %s)", type(err).__name__, err)
            return None

    def log(self, client, run_id: str, metrics, tags=()) -> None:
        """Store `metrics` ([key, value, timestamp, step] each) and `tags` ([key, value] each) for `run_id`; what
        needs MLflow goes through `client.log_batch`, and its errors are raised as they are."""
        import mlflow
        from mlflow.entities import Metric, RunTag

        tags = [RunTag(*t) for t in tags]
        if mlflow.get_active_model_id() is not None or not _plain(metrics):
            client.log_batch(run_id, metrics=[Metric(*m) for m in metrics], tags=tags)
            return
        known = self._known.setdefault(run_id, set())
        first = {}
        for m in metrics:
            if m[0] not in known:
                first.setdefault(m[0], m)
        if first or tags:
            client.log_batch(run_id, metrics=[Metric(*m) for m in first.values()], tags=tags)
            known.update(first)
        if not self._write(run_id, metrics):
            client.log_batch(run_id, metrics=[Metric(*m) for m in metrics])  # raises MLflow's error for that run

    def _write(self, run_id: str, metrics) -> bool:
        """The rows, in one transaction; False (nothing written) when the run is missing or deleted."""
        if not metrics:
            return True
        rows, newest = [], {}
        for key, value, timestamp, step in metrics:
            value = float(value)
            is_nan = math.isnan(value)
            if is_nan:
                value = 0.0
            elif math.isinf(value):
                value = LARGEST if value > 0 else -LARGEST
            row = dict(run_uuid=run_id, key=key, value=value, timestamp=int(timestamp), step=int(step), is_nan=is_nan)
            rows.append(row)
            if key not in newest or _order(row) > _order(newest[key]):  # the first of equals, as MLflow keeps
                newest[key] = row
        sa, latest = self._sa, self._latest
        with self._engine.connect() as conn:
            # The insert first: the run's state is then read under the write lock, so no delete slips in between.
            conn.execute(self._insert, rows)
            stage = conn.execute(sa.select(self._runs.c.lifecycle_stage).where(self._runs.c.run_uuid == run_id)).scalar()
            if stage != "active":
                conn.rollback()
                return False
            stored = conn.execute(sa.select(latest).where(latest.c.run_uuid == run_id, latest.c.key.in_(list(newest))))
            have = {row.key: row for row in stored}
            for key, row in newest.items():
                old = have.get(key)
                if old is None:
                    conn.execute(latest.insert(), row)
                elif _order(row) > (old.step, old.timestamp, old.value):
                    conn.execute(
                        latest.update()
                        .where(latest.c.run_uuid == run_id, latest.c.key == key)
                        .values(value=row["value"], timestamp=row["timestamp"], step=row["step"], is_nan=row["is_nan"])
                    )
            conn.commit()
        return True


def _plain(metrics) -> bool:
    """Whether every row is what RunLog sends, which MLflow would take as it is."""
    if len(metrics) > BATCH:
        return False
    for row in metrics:
        if len(row) != 4:
            return False
        _, value, timestamp, step = row
        if type(value) not in (float, int) or type(timestamp) is not int or timestamp < 0 or type(step) is not int:
            return False
    return True


def _order(row: dict) -> tuple:
    return row["step"], row["timestamp"], row["value"]
