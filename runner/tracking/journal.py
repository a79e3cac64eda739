"""Every metric value a run logs, appended to `<output_dir>/mlflow_journal.jsonl` about once a second, so a
process killed with -9 loses at most that second. `resume=` (or a rerun in the directory) sends what the
store never got, and the rerun does not log again the steps the journal already holds.

Lines are `[key, value, timestamp_ms, step]`, plus `{"delivered": N}` after each batch the store took (N:
values delivered so far, in journal order). Sending a value twice is harmless: MLflow keeps one row per
(key, timestamp, step, value).
"""

import json
import os

from runner.config import layout

FILE = layout.JOURNAL_FILE


def path_in(directory: str) -> str:
    return os.path.join(directory, FILE)


class Journal:
    """Appends rows as they are journaled; the writer is the sender thread only."""

    def __init__(self, directory: str, last_step: int | None = None):
        os.makedirs(directory, exist_ok=True)
        self.path = path_in(directory)
        self._file = open(self.path, "a", buffering=1 << 16)
        if last_step is not None:  # a resumed run's watermark, kept should this attempt die too
            self._file.write(json.dumps({"last_step": last_step}) + "\n")
            self._file.flush()

    def append(self, rows: list[tuple]) -> None:
        if rows:
            self._file.write("".join(json.dumps(row) + "\n" for row in rows))
            self._file.flush()  # into the page cache: survives the process, not a power cut

    def delivered(self, total: int) -> None:
        self._file.write(json.dumps({"delivered": total}) + "\n")
        self._file.flush()

    def close(self, remove: bool) -> None:
        self._file.close()
        if remove:
            try:
                os.remove(self.path)
            except FileNotFoundError:  # the run's directory was deleted under it: nothing left to remove
                pass


DAMAGED = FILE + ".damaged"


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def scan(directory: str):
    """(rows, values delivered, watermarks, lines that are neither a row nor a mark, the last line among them)."""
    rows, delivered, steps, damaged = [], 0, [], 0
    with open(path_in(directory), "rb") as f:
        lines = f.read().split(b"\n")
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    cut_last = False
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            item = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):  # the last line, cut by the kill (or damage)
            item = None
        if isinstance(item, dict) and isinstance(item.get("delivered", 0), int) and isinstance(item.get("last_step", 0), int):
            delivered = int(item.get("delivered", delivered))
            steps += [item["last_step"]] if "last_step" in item else []
        elif (
            isinstance(item, list)
            and len(item) == 4
            and isinstance(item[0], str)
            and _number(item[1])
            and _number(item[2])
            and isinstance(item[3], int)
            and not isinstance(item[3], bool)
        ):
            rows.append(tuple(item))
        elif i == last and item is None:
            cut_last = True
        else:
            damaged += 1
    return rows, delivered, steps, damaged, cut_last


def read(directory: str | None):
    """(rows not yet delivered, the largest step journaled) of a journal left behind, or ([], None). Lines that are
    neither a row nor a mark (a line cut by the kill, bytes that are not text) are skipped."""
    if not directory or not os.path.isfile(path_in(directory)):
        return [], None
    rows, delivered, steps, _, _ = scan(directory)
    last_step = max([row[3] for row in rows] + steps, default=None)
    return rows[max(0, delivered) :], last_step
