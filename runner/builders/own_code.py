"""Your own code that raises during training: one paragraph naming the key, its `_target_`, the error's own line and
where in your file, instead of a Python or TensorFlow traceback (UserCodeError, exit 6).

The checks before the first step call the model, the loss and the metrics once; what fails only later (a callback's
hook, a batch the probe did not see, a data function's generator part-way through) is told from the error itself:
a Python frame in the file of a `_target_`'s module, or, for an error raised while TensorFlow traced or ran a step,
its `in user code: File "<path>", line N` note naming that file. Files of installed libraries and of the runner are
never "yours", so a built-in `_target_` (tf_keras.metrics.AUC) is left to the other handlers. No TensorFlow here.
"""

import importlib.util
import inspect
import os
import re
import sysconfig
import traceback

from runner.builders.targets import locate
from runner.config import layout
from runner.errors import UserCodeError, chain, runners_own

_FILE_LINE = re.compile(r'File "([^"]+)", line (\d+)')
_ERROR_LINE = re.compile(r"^\s*((?:\w+\.)*\w*(?:Error|Exception|Exit|Interrupt)\w*): (.+)$")
NO_GRADIENT = "No gradients provided for any variable"


def targets(cfg) -> list[tuple[str, str]]:
    """(key, dotted path) of every `_target_` in the config that names code to run during training."""
    found = []

    def add(key, node):
        target = node.get("_target_") if hasattr(node, "get") else None
        if target:
            found.append((key, str(target)))

    add("model", cfg.model)
    if cfg.data.get("name") == "function":
        add("data", cfg.data)
    add("train.loss", cfg.train.loss)
    for i, spec in enumerate(cfg.train.get("metrics") or []):
        add(f"train.metrics[{i}]", spec)
    add("train.optimizer", cfg.train.optimizer)
    add("train.optimizer.schedule", cfg.train.optimizer.schedule)
    for i, spec in enumerate(cfg.executor.get("callbacks") or []):
        add(f"executor.callbacks[{i}]", spec)
    return found


def _libraries() -> tuple[str, ...]:
    """Directories whose files are not the user's: installed packages, the standard library, the runner."""
    paths = sysconfig.get_paths()
    dirs = {paths[k] for k in ("purelib", "platlib", "stdlib", "platstdlib") if k in paths}
    dirs.add(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # runner/
    return tuple(os.path.realpath(d) + os.sep for d in dirs)


def _module_file(target: str) -> str | None:
    parts = target.split(".")
    for i in range(len(parts) - 1, 0, -1):
        try:
            spec = importlib.util.find_spec(".".join(parts[:i]))
        except Exception:  # noqa: BLE001  (a parent package that fails to import: not this target's file)
            continue
        if spec is not None and spec.origin and os.path.isfile(spec.origin):
            return os.path.realpath(spec.origin)
    return None


def _source(target: str) -> tuple[str | None, range | None]:
    """(file, its lines) of the object a dotted path names: where it is defined (a re-exported name: its own
    module), else the module the path names, with no lines."""
    try:
        obj = locate(target)
        path = inspect.getsourcefile(obj)
        first, lines = inspect.getsourcelines(obj)[1], len(inspect.getsourcelines(obj)[0])
        return os.path.realpath(path), range(max(first, 1), max(first, 1) + lines)
    except Exception:  # noqa: BLE001  (a builtin, a C extension, an object without source: the module's file)
        return _module_file(target), None


def own_files(cfg) -> dict[str, list[tuple[str, str, range | None]]]:
    """{file: [(key, target, its lines)]} of the config's `_target_`s that are the user's code (several may share
    one file: a project's model, loss and callbacks)."""
    libraries = _libraries()
    files = {}
    for key, target in targets(cfg):
        path, lines = _source(target)
        if path and not path.startswith(libraries):
            files.setdefault(path, []).append((key, target, lines))
    return files


def _owner(entries, line: int) -> tuple[str, str]:
    """(key, target) of the entry whose source holds `line`; the only one; else every key of that file, named."""
    holding = [(k, t) for k, t, lines in entries if lines is not None and line in lines]
    if len(holding) == 1 or len(entries) == 1:
        return holding[0] if holding else entries[0][:2]
    keys = ", ".join(f"{k}._target_={t!r}" for k, t, _ in entries)
    return f"the code of {keys} (one file)", ""


# TensorFlow errors about the machine or the cluster, whatever op they name: never the user's code
NOT_CODE = ("ResourceExhaustedError", "UnavailableError", "DeadlineExceededError", "AbortedError", "DataLossError")


def _user_code_notes(text: str) -> str:
    """The `in user code:` part of a TensorFlow error (not its "Detected at node ... defined at" trace, which names
    where an op was made, not what failed)."""
    if "in user code:" not in text:
        return ""
    return text.split("in user code:", 1)[1].split("Detected at node", 1)[0]


def _places(err: BaseException) -> list[tuple[str, int]]:
    """(file, line) of every Python frame and every `File "...", line N` of TensorFlow's user-code notes, outermost
    first."""
    places = []
    for e in reversed(chain(err)):
        places += [(os.path.realpath(f.filename), f.lineno or 0) for f in traceback.extract_tb(e.__traceback__)]
        if type(e).__name__ not in NOT_CODE:
            places += [(os.path.realpath(path), int(line)) for path, line in _FILE_LINE.findall(_user_code_notes(str(e)))]
    return places


def error_line(err: BaseException) -> str:
    """The error's own sentence: the last `SomeError: message` line of its text (TensorFlow puts the user's error
    last, after its `in user code:` frames), else its type and first line."""
    if isinstance(err, SystemExit):  # sys.exit() mid-training: the run did not end, whatever the status asked
        return f"it called sys.exit({err.code!r})"
    text = str(err)
    lines = [m.group(1).rsplit(".", 1)[-1] + ": " + m.group(2).strip() for m in map(_ERROR_LINE.match, text.splitlines()) if m]
    said = lines[-1] if lines else f"{type(err).__name__}: {text.strip().splitlines()[0] if text.strip() else ''}".rstrip(": ")
    return " ".join(said.split())[:400]


def raised(err: BaseException, cfg, step=None, output_dir=None, checkpoint_dir=None, trained=True) -> UserCodeError | None:
    """A UserCodeError when `err` came from the user's own code (a `_target_`'s file), or is TensorFlow finding no
    gradient through the user's loss or model; else None (the runner's own errors, a stop wrapped by user code, and
    everything else). A SystemExit from the user's code is one too: sys.exit(0) in a callback must not end a
    half-trained run with exit 0. `trained`: whether a training step had run (what the paragraph says was kept)."""
    if not isinstance(err, (Exception, SystemExit)) or runners_own(err) is not None:
        return None
    files = own_files(cfg)
    if not files:
        return None
    if trained:
        when = f"during training (after step {step})" if step else "during training"
        resume = f"python -m runner resume={output_dir}" if output_dir else "python -m runner resume=<the run's output directory>"
        kept = f"The run stopped; {layout.checkpoint_note(checkpoint_dir)}. Fix it, then continue with: {resume}."
    else:
        when, kept = "before the first training step", "Nothing was trained; fix it and run again."
    told = _told(err, files, when, kept)
    if told is not None:
        told.trained_nothing = not trained  # refused before the first step: its run is deleted, as other refusals'
    return told


def _told(err, files, when: str, kept: str) -> UserCodeError | None:
    owners = {k: (k, t) for entries in files.values() for k, t, _ in entries}
    if NO_GRADIENT in str(err) and ("train.loss" in owners or "model" in owners):
        key, target = owners.get("train.loss") or owners["model"]
        how = (
            "the loss does not depend on the model's output"
            if key == "train.loss"
            else "the model's output does not depend on its weights"
        )
        return UserCodeError(
            f"{key}._target_={target!r}: TensorFlow found no gradient for any of the model's weights {when} ({how} "
            f"in a differentiable way: tf.stop_gradient, a cast to an integer, argmax, or NumPy?). {kept}"
        )
    hits = [(path, line) for path, line in _places(err) if path in files]
    if not hits:
        return None
    path, line = hits[-1]  # the innermost place in the user's code: where it raised
    key, target = _owner(files[path], line)
    who = f"{key}._target_={target!r}" if target else key
    return UserCodeError(f"{who} raised {when}: {error_line(err)} ({path}, line {line}). {kept}")
