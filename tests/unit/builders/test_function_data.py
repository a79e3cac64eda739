"""data=function before TensorFlow: a user's function of NumPy arrays checked as data=npz's are, and the probe that
finds its module without importing it (the dataset_fn side trains in tests/e2e/test_inputs.py)."""

import sys

import numpy as np
import pytest
from omegaconf import OmegaConf

from runner.builders.data import function
from runner.config import schema
from runner.errors import ConfigError

from helpers import ROOT, composed

USER = ROOT / "tests" / "user_project"


@pytest.fixture(autouse=True)
def user_path(monkeypatch):
    monkeypatch.syspath_prepend(str(USER))


def data(*overrides):
    return composed("data=function", *overrides).data


def test_arrays_come_back_checked_with_eval_held_out_when_absent(monkeypatch):
    arrays = function.load_source(data("data._target_=my_data.pairs"))
    assert arrays.x_train.shape == (256, 6) and arrays.x_eval.shape == (64, 6)
    assert arrays.task == "classification" and arrays.num_classes == 2 and arrays.y_train.dtype == np.int32
    module = type(sys)("two_arrays")
    module.make = lambda n=50: (np.ones((n, 3), "float32"), np.linspace(0, 1, n).astype("float32"))
    monkeypatch.setitem(sys.modules, "two_arrays", module)
    held = function.load_source(data("data._target_=two_arrays.make", "+data.kwargs.n=50"))
    assert held.task == "regression" and len(held.x_train) + len(held.x_eval) == 50 and len(held.x_eval) == 10


@pytest.mark.parametrize(
    "returned, needle",
    [
        (None, "returned NoneType; return NumPy arrays"),
        ({"x_train": np.ones((4, 2))}, "returned a dict with keys ['x_train']"),
        ((np.ones((4, 2)), np.array([0, 1, 0, np.nan])), "NaN"),
        ((np.ones((4, 2)), np.zeros(3)), "x_train"),
    ],
)
def test_what_the_function_returns_is_checked_by_name(monkeypatch, returned, needle):
    module = type(sys)("returns")
    module.make = lambda: returned
    monkeypatch.setitem(sys.modules, "returns", module)
    with pytest.raises(ConfigError, match="data._target_='returns.make'") as err:
        function.load_source(data("data._target_=returns.make"))
    assert needle in str(err.value)


def test_a_function_that_is_not_there_is_named():
    with pytest.raises(ConfigError, match="'my_data' has no function 'nope'"):
        function.load_source(data("data._target_=my_data.nope"))
    with pytest.raises(ConfigError, match=r"does not take data.kwargs \['bogus'\]"):
        function.load_source(data("data._target_=my_data.pairs", "+data.kwargs.bogus=1"))


def test_a_function_that_fails_is_one_line_naming_where(monkeypatch):
    module = type(sys)("failing")

    def make():
        raise RuntimeError("disk on fire\nmore detail")

    module.make = make
    monkeypatch.setitem(sys.modules, "failing", module)
    with pytest.raises(ConfigError) as err:
        function.load_source(data("data._target_=failing.make"))
    assert "data._target_='failing.make' raised RuntimeError: disk on fire (at test_function_data.py:" in str(err.value)
    assert "\n" not in str(err.value)


def test_the_probe_finds_the_module_without_importing_it():
    cfg = composed("data=function", "data._target_=my_data.pairs")
    sys.modules.pop("my_data", None)
    function._module_found(cfg)
    assert "my_data" not in sys.modules  # found on the path, not run (a user's module may import TensorFlow)
    with pytest.raises(ConfigError, match="no module 'nosuch' on the Python path"):
        function._module_found(composed("data=function", "data._target_=nosuch.fn"))
    with pytest.raises(ConfigError, match="names no function: give module.function"):
        function._module_found(composed("data=function", "data._target_=my_data"))


def test_the_schema_takes_the_users_keys():
    cfg = composed("data=function", "data._target_=my_data.pairs", "+data.kwargs.n=64", "data.num_classes=3")
    assert OmegaConf.to_container(cfg.data.kwargs) == {"n": 64} and cfg.data.num_classes == 3
    assert "function" in schema.GROUP_SCHEMAS["data"]


def test_ctrl_c_inside_the_users_function_is_a_stop_not_the_functions_fault(tmp_path, monkeypatch):
    """Ctrl-C lands while the user's code runs (the data function, a `_target_`'s import): the runner's Stopped goes
    through, so the run ends KILLED with 130, not exit 2 blaming the function (each wrapper of user code re-raises
    the runner's own errors)."""
    import signal

    from runner.builders.targets import callable_at
    from runner.control.stopping import Stopped

    def interrupted(**kwargs):
        raise Stopped(signal.SIGINT, "stopped by SIGINT")

    with pytest.raises(Stopped):
        function._call(OmegaConf.create({"_target_": "mine.f", "kwargs": None}), interrupted)
    (tmp_path / "slow_import.py").write_text(
        "import signal\nfrom runner.control.stopping import Stopped\nraise Stopped(signal.SIGINT, 'stopped by SIGINT')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(Stopped):
        callable_at("model", "slow_import.build", "hint")
