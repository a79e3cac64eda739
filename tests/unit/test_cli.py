"""The command lines a user meets first, run as real subprocesses: `python -m runner.dashboard`,
`python -m runner --help` and `python -m runner.deliver`; and what a mistyped key or option on that command line
gets back (in process, through Hydra's compose API, and end to end)."""

import os
import queue
import re
import signal
import socket
import string
import subprocess
import sys
import threading
import time
import urllib.request

import pytest
import yaml
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException, MissingConfigException

from runner.config import helptext, registry, schema, suggest, validate
from runner.errors import ConfigError

from helpers import ROOT, composed, runner_imports

schema.register()

CONF = ROOT / "conf"
HELP_YAML = CONF / "hydra" / "help" / "runner.yaml"


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _lines(proc):
    """A queue that receives every line `proc` prints, read in the background."""
    lines = queue.Queue()

    def read():
        for line in proc.stdout:
            lines.put(line.rstrip("\n"))

    threading.Thread(target=read, daemon=True).start()
    return lines


def _get(url):
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.status, response.read()


@pytest.mark.slow  # end to end: starts a real MLflow server
def test_dashboard_prints_its_address_once_it_answers_and_stays_quiet(tmp_path):
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "runner.dashboard", "--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db", "--port", str(port)],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines, seen = _lines(proc), []
    try:
        deadline = time.monotonic() + 120
        while True:
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            seen.append(line)
            if "http://" in line:
                break
        url = re.search(r"http://\S+", line).group(0)
        assert url == f"http://127.0.0.1:{port}/#/experiments?workflowType=machine_learning", seen
        assert _get(url)[0] == 200  # it answers at the moment the address is printed
        base = f"http://127.0.0.1:{port}"
        for _ in range(2):  # two page loads: the page, its scripts and styles, and the API calls it makes
            status, html = _get(f"{base}/")
            assert status == 200
            for asset in re.findall(r'(?:src|href)="\.?/?(static-files/[^"]+)"', html.decode()):
                _get(f"{base}/{asset}")
            _get(f"{base}/ajax-api/2.0/mlflow/experiments/search?max_results=10")
        time.sleep(1.0)
        while not lines.empty():
            seen.append(lines.get())
        output = "\n".join(seen)
        assert "GET /" not in output, output  # no access log
        assert "Warning" not in output, output  # no deprecation warnings
        assert "Security middleware" not in output and "Traceback" not in output, output  # MLflow's click.echo line
        assert len(seen) <= 4, output

        proc.send_signal(signal.SIGINT)  # Ctrl-C stops the server's whole process group, then the dashboard
        assert proc.wait(timeout=30) == 130
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", port)) != 0  # nothing listens there any more
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_dashboard_on_a_taken_port_says_so_at_once(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "runner.dashboard", "--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 2
    assert f"127.0.0.1:{port}" in done.stderr and "--port" in done.stderr and "Traceback" not in done.stderr


def test_dashboard_verbose_keeps_the_servers_own_output():
    from runner.dashboard import server_command, server_env

    assert "--no-access-log" in " ".join(server_command("sqlite:///x.db", "127.0.0.1", 5000))
    assert "--uvicorn-opts" not in server_command("sqlite:///x.db", "127.0.0.1", 5000, verbose=True)
    assert server_env()["PYTHONWARNINGS"] == "ignore"
    assert server_env(verbose=True).get("PYTHONWARNINGS") == os.environ.get("PYTHONWARNINGS")


def _help_groups():
    """{group: [options]} as --help lists them (`group: a, b, c  (what the group is)`)."""
    template = _help_text()
    section = template.split("== Config groups")[1].split("==\n", 1)[1].split("\n== ")[0]
    return {m.group(1): m.group(2).split("  (")[0].split(", ") for m in re.finditer(r"^(\w+): (.+)$", section, re.M)}


def _composed(*overrides):
    return composed(*overrides)


def _help_text(*overrides) -> str:
    """What `python -m runner --help` prints, in process: Hydra's help config, composed, through its template as
    Hydra fills it (hydra/_internal/hydra.py, get_help); the dynamic parts are empty, as the template uses none."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=list(overrides), return_hydra_config=True)
    filled = dict(FLAGS_HELP="", HYDRA_CONFIG_GROUPS="", APP_CONFIG_GROUPS="", CONFIG="")
    return string.Template(cfg.hydra.help.template).substitute(filled)


def _option_lines(text: str) -> dict[str, dict[str, str]]:
    """{group: {option: its description}} from the option lines of the help's Config groups section."""
    section = text.split("== Config groups")[1].split("\n== ")[0]
    found, group = {}, None
    for line in section.splitlines()[1:]:
        heading = re.match(r"^(\w+): ", line)
        if heading:
            group = heading.group(1)
            found[group] = {}
        elif m := re.match(r"^    (\w+)(\*?)  +(\S.*)$", line):
            found[group][m.group(1) + m.group(2)] = m.group(3)
    return found


def test_help_template_lists_every_group_and_option_in_conf():
    on_disk = {
        d.name: sorted(f.stem for f in d.glob("*.yaml"))
        for d in CONF.iterdir()
        if d.is_dir() and d.name not in ("hydra", "__pycache__")
    }
    listed = {group: sorted(options) for group, options in _help_groups().items()}
    assert listed == on_disk  # rendered from the registry and conf/: a new option's file is all it takes


def test_help_template_names_every_plain_node():
    config = yaml.safe_load((CONF / "config.yaml").read_text())
    template = yaml.safe_load(HELP_YAML.read_text())["template"]
    plain = template.split("== Plain config nodes")[1].split("\n== ")[0]
    for key in set(config) - {"defaults", "hydra"}:
        assert re.search(rf"^{key}\b", plain, re.M), f"{key} is missing from the --help template"


def test_help_is_one_page_and_the_composed_config_only_on_request():
    """--help was 152 lines, 80 of them the composed config: now what the command does, the groups, the most-used
    keys and examples, in about 60 lines of at most 114 characters; `--cfg job` prints the config."""
    text = _help_text("strategy=mirrored")
    lines = text.splitlines()
    assert len(lines) <= 67, f"--help is {len(lines)} lines"
    assert max(len(line) for line in lines) <= helptext.WIDTH
    assert "$CONFIG" not in yaml.safe_load(HELP_YAML.read_text())["template"]
    assert "name: mirrored" not in text and "_target_: runner.models" not in text  # no config dump
    assert lines[0].startswith("python -m runner: a TensorFlow tf.distribute experiment")
    assert "python -m runner --cfg job" in text and "Usage: python -m runner [group=option ...] [key=value ...]" in text
    for section in ("== Config groups", "== Plain config nodes"):
        assert section in text
    assert "--hydra-help" in text and "$MLFLOW_TRACKING_URI" in text  # `$$` in the template is one dollar sign


def test_help_lists_the_default_option_first_and_marks_it():
    """strategy=auto, the default, was listed last: each group's default (conf/config.yaml) comes first in its
    heading and on its option lines, marked `*`; model's options stay by name (the default marked only)."""
    defaults = yaml.safe_load((CONF / "config.yaml").read_text())["defaults"]
    default = {g: o for d in defaults if isinstance(d, dict) for g, o in d.items() if o and not g.startswith("override")}
    assert helptext.defaults() == default
    groups, options = _help_groups(), _option_lines(_help_text())
    assert groups["strategy"][0] == "auto" and next(iter(options["strategy"])) == "auto*"
    for group, names in groups.items():
        marked = [name for name in options[group] if name.endswith("*")]
        assert marked == ([default[group] + "*"] if group in default else []), group
        if group in registry.GROUPS:
            assert names[0] == default[group] and next(iter(options[group])) == default[group] + "*", group
    assert "one of the others" in options["strategy"]["auto*"]  # not "of the above": it is listed first now


def test_help_describes_every_option_on_one_line_models_included():
    """Every option of every group has a description on its own line; model's (and experiment's) come from the
    first sentence of its YAML file's leading comment, so a new model file brings its own."""
    options = _option_lines(_help_text())
    assert {g: sorted(n.rstrip("*") for n in names) for g, names in options.items()} == {
        g: sorted(names) for g, names in _help_groups().items()
    }
    for group, described in options.items():
        for name, text in described.items():
            assert len(text) >= 10, f"{group}={name} has no description"
    assert options["model"]["mlp*"].startswith("Dense layers with an activation")
    assert options["model"]["cnn"] == "Conv2D + max-pool blocks, then Dense layers"
    assert "model.application" in options["model"]["keras_app"]
    for path in sorted((CONF / "model").glob("*.yaml")) + sorted((CONF / "experiment").glob("*.yaml")):
        assert len(helptext.described(path)) >= 10, f"{path.name} starts with no comment that describes it"


def test_one_line_cuts_at_a_clause_boundary():
    assert helptext.one_line("short", 10) == "short"
    assert helptext.one_line("a thing, with more, and more still", 20) == "a thing, with more"
    assert helptext.one_line("name (a: b, c; d: e)", 16) == "name (a: b, c)"  # inside brackets at '; ', closed
    assert len(helptext.one_line("x" * 50, 20)) == 20


# --- a mistyped key, group or option: one paragraph, the closest real names (Hydra's refusals: exit 1) ---------------
def _refused(*overrides, kind=ConfigCompositionException) -> str:
    with pytest.raises(kind) as err:
        _composed(*overrides)
    message = str(err.value)
    assert "\n" not in message and message.startswith("Error: "), message  # one paragraph
    assert err.value.__cause__ is None  # Hydra would print an OmegaConf cause as a second block
    return message


@pytest.mark.parametrize(
    "override,needles",
    [
        # tests/e2e/test_errors.py's rows keep Hydra's own words in the paragraph
        (
            "train.epoch=3",
            [
                "train.epoch is not a key of train: did you mean train.epochs=3?",
                "Key 'epoch' not in 'TrainConfig'",
                "full_key: train.epoch",
                "The keys of train are: epochs, steps_per_epoch",
            ],
        ),  # fmt: skip
        ("stratgy=mirrored", ["stratgy is not a key of the config: did you mean strategy=mirrored?"]),
        ("trian.epochs=3", ["trian is not a key of the config: did you mean train.epochs=3?"]),
        ("train.optimizer.learnig_rate=0.1", ["did you mean train.optimizer.learning_rate=0.1?"]),
        ("hydra.run.dri=x", ["did you mean hydra.run.dir=x?"]),
        ("model.hiden_units=[3]", ["did you mean model.hidden_units=[3]?", "A new key is added with +model.hiden_units=[3]"]),
        ("train.zzzzz=1", ["train.zzzzz is not a key of train, and none of its keys has a similar name"]),
        # a key of another option than the selected one (strategy=auto has none of its own)
        ("strategy.devices=[/cpu:0]", ["is not a key of strategy=auto", "strategy=mirrored strategy.devices=[/cpu:0]"]),
    ],
)
def test_a_mistyped_key_is_one_paragraph_with_the_closest_keys(override, needles):
    message = _refused(override)
    for needle in needles:
        assert needle in message, message
    assert "--cfg job" in message and "To append to your config" not in message  # `+` would bypass the schema


@pytest.mark.parametrize("override", ["train.epochs=https://alice:hunter2@host/x", "train.epoch=https://alice:hunter2@host/x"])
def test_a_password_in_an_override_hydra_refuses_is_masked(override):
    with pytest.raises(ConfigCompositionException) as err:
        _composed(override)
    said = f"{err.value}\n{err.value.__cause__ or ''}"  # what Hydra prints: the message, then its cause
    assert "hunter2" not in said and "alice:***@host" in said, said


def test_a_key_of_the_option_next_door_gets_both_hints():
    message = _refused("strategy=mirrored", "strategy.device=/gpu:0")
    assert "did you mean strategy.devices=/gpu:0?" in message and "Key 'device' not in 'MirroredConfig'" in message
    assert "strategy=one_device strategy.device=/gpu:0" in message, message


@pytest.mark.parametrize(
    "override,needles",
    [
        (
            "strategy=mirored",
            [
                "strategy=mirored is not an option of strategy: did you mean strategy=mirrored?",
                "Could not find 'strategy/mirored'",
                "central_storage",
                "searched pkg://hydra.conf",
            ],
        ),  # fmt: skip
        ("executor=custom_lop", ["did you mean executor=custom_loop?"]),
        ("executor=fast", ["executor=fast is not an option of executor, and no option has a similar name", "custom_loop, fit"]),
        ("hydra/launcher=jobib", ["did you mean hydra/launcher=joblib?"]),
    ],
)
def test_a_mistyped_option_is_one_paragraph_with_the_closest_options(override, needles):
    message = _refused(override, kind=MissingConfigException)
    for needle in needles:
        assert needle in message, message


def test_a_key_added_past_the_schema_gets_the_same_hint_from_the_runners_check():
    """`+key=value` bypasses Hydra's refusal; runner/config/validate.py refuses the key (exit 2) with the same hint."""
    for overrides, needle in [
        (["+train.epoch=3"], "train.epoch is not a key of train (added with +train.epoch=...?): did you mean train.epochs=3?"),
        (["+stratgy=mirrored"], "stratgy is not a key of the config (added with +stratgy=...?): did you mean strategy=mirrored?"),
        (["strategy=mirrored", "+strategy.devicez=[/cpu:0]"], "strategy.devicez is not a key of strategy=mirrored"),
        (["+train.optimizer.momentun=0.9"], "did you mean train.optimizer.momentum=0.9?"),
    ]:
        with pytest.raises(ConfigError) as err:
            validate.check_config(_composed(*overrides))
        assert needle in str(err.value) and "\n" not in str(err.value), str(err.value)
        assert err.value.exit_code == 2


def test_close_names_suggests_only_what_is_close():
    assert suggest.close_names("epoch", ["epochs", "seed", "loss"]) == ["epochs"]
    assert suggest.close_names("zzz", ["epochs", "seed"]) == []


def test_a_key_of_another_option_is_suggested_as_the_whole_override_given():
    """cluster.elastic.enabled=true under cluster=tpu: the hint repeats the key as typed, not only its first part."""
    message = suggest.override_problem("cluster.elastic.enabled", "true", _composed("cluster=tpu"), "Hydra's words")
    assert "select it first (cluster=localhost cluster.elastic.enabled=true)" in message, message
    message = suggest.override_problem("strategy.devices", "2", _composed(), "Hydra's words")
    assert "select it first (strategy=mirrored strategy.devices=2)" in message, message


@pytest.mark.slow  # end to end: runs `python -m runner` six times
def test_a_mistyped_name_on_the_command_line_exits_as_documented_with_a_hint(tmp_path):
    """README: Hydra refuses unknown keys and options while composing (exit 1); keys that `+key=value` added past
    the schemas are the runner's check (exit 2). Each is one paragraph (without Hydra's HYDRA_FULL_ERROR line), no
    traceback, before TensorFlow."""
    for args, code, needle in [
        (["train.epoch=3"], 1, "did you mean train.epochs=3?"),
        (["stratgy=mirrored"], 1, "did you mean strategy=mirrored?"),
        (["strategy=mirored"], 1, "did you mean strategy=mirrored?"),
        (["+train.epoch=3"], 2, "did you mean train.epochs=3?"),
        (["--help", "train.epoch=3"], 1, "did you mean train.epochs=3?"),  # Hydra's help path printed a traceback
        (["+hydra.callbacks.x._target_=nope.Nope"], 2, "hydra.callbacks.x: Error locating target 'nope.Nope'"),
    ]:
        argv = [sys.executable, "-m", "runner", *args, f"hydra.run.dir={tmp_path}/run", "mlflow.enabled=false"]
        started = time.monotonic()
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert done.returncode == code and needle in done.stderr, (args, done.returncode, done.stderr[-2000:])
        assert "Traceback" not in done.stderr and done.stderr.startswith("Error: "), done.stderr[-2000:]
        assert len([p for p in done.stderr.split("\n\n") if p.strip()]) == 1 and "HYDRA_FULL_ERROR" not in done.stderr
        assert time.monotonic() - started < 30  # before TensorFlow (its import alone is seconds)


@pytest.mark.slow  # end to end: runs the runner in a subprocess
def test_help_lists_the_user_groups_not_the_schemas_and_skips_tensorflow():
    done, loaded = runner_imports(["--help", "strategy=mirrored"])
    out = done.stdout
    assert "schema/" not in out
    for group, options in _help_groups().items():
        assert f"{group}: {', '.join(options)}" in out
    assert "name: mirrored" not in out and "python -m runner --cfg job" in out  # the composed config: on request only
    assert len(out.splitlines()) <= 68 and loaded == []  # 67 lines of help, then the probe's own


@pytest.mark.slow  # end to end: runs `python -m runner --help` into a pipe
def test_help_into_a_reader_that_stops_early_prints_no_traceback():
    """`python -m runner --help | head -1`: the reader goes away after one line; the rest of --help (about 60 lines, 4.8 kB) meets
    a closed pipe. A pipe smaller than --help makes that certain here: stdout is a socket pair with a tiny buffer."""
    import socket

    ours, theirs = socket.socketpair()
    theirs.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1024)
    proc = subprocess.Popen([sys.executable, "-m", "runner", "--help"], stdout=theirs, stderr=subprocess.PIPE, cwd=ROOT)
    theirs.close()
    first = ours.recv(200)
    ours.close()  # the reader is gone
    _, err = proc.communicate(timeout=60)
    assert first.startswith(b"python -m runner")
    assert proc.returncode == 141 and b"Traceback" not in err and b"BrokenPipe" not in err, err[-2000:]


def test_deliver_refuses_a_directory_that_is_not_a_run(tmp_path):
    missing = tmp_path / "no-such-run"
    (tmp_path / "empty").mkdir()
    for directory in (missing, tmp_path / "empty"):
        done = subprocess.run(
            [sys.executable, "-m", "runner.deliver", str(directory)], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 2, done
        assert str(directory) in done.stderr and "outputs/<date>/<time>" in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


def test_deliver_in_a_run_directory_with_nothing_pending_succeeds(tmp_path):
    (tmp_path / ".hydra").mkdir()
    done = subprocess.run([sys.executable, "-m", "runner.deliver", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "Nothing to deliver" in done.stdout


@pytest.mark.slow  # end to end: runs `python -m runner` three times
def test_an_output_directory_that_cannot_be_made_is_one_error_before_anything_runs(tmp_path):
    """Hydra makes the run directory before any runner code runs: a path under a regular file, or under /proc,
    used to end in its traceback."""
    (tmp_path / "a-file").write_text("")
    for override in (
        f"hydra.run.dir={tmp_path}/a-file/run",
        "hydra.run.dir=/proc/no-such/run",
        f"hydra.sweep.dir={tmp_path}/a-file/sweep",
    ):
        argv = [sys.executable, "-m", "runner", *(["-m"] if "sweep" in override else []), override]
        started = time.monotonic()
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=tmp_path)
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
        assert done.stderr.startswith(f"Error: {override} cannot be used")
        assert time.monotonic() - started < 10  # before TensorFlow


@pytest.mark.slow  # end to end: `python -m runner` twice, before Hydra and TensorFlow
def test_an_unreadable_override_and_two_commands_exit_2_in_one_line(tmp_path):
    unresolved = ["--cfg", "job", "--resolve", "train.epochs=${train.seed_x}"]  # OmegaConf's traceback before
    for argv in (["mlflow.tracking_uri=sqlite:///runs.db?timeout=20"], ["-m", "--cfg", "job"], unresolved):
        done = subprocess.run([sys.executable, "-m", "runner", *argv], capture_output=True, text=True, timeout=60, cwd=tmp_path)
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
        assert done.stderr.startswith("Error: ") and len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert not list(tmp_path.iterdir())  # nothing written: no outputs/, no store
        assert argv != unresolved or "train.epochs=${train.seed_x}: the interpolation refers to train.seed_x" in done.stderr
    # Hydra prints its own node without the job's keys: hydra.run.dir's resume= must not be a missing key there
    argv = [sys.executable, "-m", "runner", "--cfg", "hydra", "--resolve", "resume=/elsewhere"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "    dir: outputs/" in done.stdout and not list(tmp_path.iterdir())


@pytest.mark.slow  # end to end: `python -m runner --cfg job` twice, before TensorFlow
def test_a_printed_config_masks_secrets_as_logs_do(tmp_path):
    """--cfg job printed a password in mlflow.tracking_uri, and --resolve a secret read through ${oc.env:...}, in clear."""
    env = {**os.environ, "MY_URI": "https://bob:s3cret@h2", "MLFLOW_TRACKING_PASSWORD": "pw-123456"}
    for argv in (
        ["--cfg", "job", "mlflow.tracking_uri=https://alice:hunter2@host/x"],
        [
            "--cfg",
            "job",
            "--resolve",
            "mlflow.tracking_uri=${oc.env:MY_URI}",
            "mlflow.run_name=${oc.env:MLFLOW_TRACKING_PASSWORD}",
        ],  # noqa: E501
    ):
        argv = [sys.executable, "-m", "runner", *argv]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env)
        assert done.returncode == 0 and "tracking_uri: https://" in done.stdout, done.stderr[-2000:]
        assert not any(s in done.stdout for s in ("hunter2", "s3cret", "pw-123456")), done.stdout
        assert "***@" in done.stdout


def test_a_working_directory_deleted_before_the_command_is_one_paragraph(tmp_path):
    """The shell's directory removed under it (another terminal's rm -r): exit 2 and what to do, not a traceback from
    the first relative path the runner resolves."""
    gone = tmp_path / "gone"
    gone.mkdir()
    script = f"cd {gone} && rmdir {gone} && exec {sys.executable} -m runner train.epochs=1"
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.startswith("Error: the working directory is gone (No such file or directory)"), proc.stderr
    assert "Traceback" not in proc.stderr and "cd to an existing directory" in proc.stderr
