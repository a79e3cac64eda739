"""The command lines a user meets first, run as real subprocesses: `python -m runner.dashboard`,
`python -m runner --help` and `python -m runner.deliver`."""

import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import pytest
import yaml

from helpers import ROOT

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
    """{group: [options]} as the --help template lists them."""
    template = yaml.safe_load(HELP_YAML.read_text())["template"]
    section = template.split("== Config groups")[1].split("==\n", 1)[1].split("\n== ")[0]
    return {m.group(1): m.group(2).split(", ") for m in re.finditer(r"^(\w+): (.+)$", section, re.M)}


def test_help_template_lists_every_group_and_option_in_conf():
    on_disk = {
        d.name: sorted(f.stem for f in d.glob("*.yaml"))
        for d in CONF.iterdir()
        if d.is_dir() and d.name not in ("hydra", "__pycache__")
    }
    listed = {group: sorted(options) for group, options in _help_groups().items()}
    assert listed == on_disk  # add an option file and its name in conf/hydra/help/runner.yaml together


def test_help_template_names_every_plain_node():
    config = yaml.safe_load((CONF / "config.yaml").read_text())
    template = yaml.safe_load(HELP_YAML.read_text())["template"]
    plain = template.split("== Plain config nodes")[1].split("\n== ")[0]
    for key in set(config) - {"defaults", "hydra"}:
        assert re.search(rf"^{key}\b", plain, re.M), f"{key} is missing from the --help template"


@pytest.mark.slow  # end to end: runs the runner in a subprocess
def test_help_lists_the_user_groups_not_the_schemas_and_skips_tensorflow():
    probe = (
        "import atexit, sys\n"
        "atexit.register(lambda: print('TF_LOADED=' + str('tensorflow' in sys.modules)))\n"
        "sys.argv = ['runner', '--help', 'strategy=mirrored']\n"
        "import runpy; runpy.run_module('runner', run_name='__main__')\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=ROOT)
    out = done.stdout
    assert "schema/" not in out
    for group, options in _help_groups().items():
        assert f"{group}: {', '.join(options)}" in out
    assert "strategy:\n  name: mirrored" in out  # the composed config, with the overrides given
    assert "TF_LOADED=False" in out


def test_help_into_a_reader_that_stops_early_prints_no_traceback():
    """`python -m runner --help | head -1`: the reader goes away after one line; the rest of --help (150 lines) meets
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
