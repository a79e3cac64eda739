"""train.jit_compile's refusal (runner.executors.xla.refused): only XLA finding an op without a kernel, at the first
call, becomes the one-paragraph refusal; any other compile failure keeps TensorFlow's own error."""

from omegaconf import OmegaConf

from runner.errors import ConfigError
from runner.executors.xla import refused

UNSUPPORTED = (
    "Detected unsupported operations when trying to compile graph while_body_169_const_0[] on XLA_CPU_JIT: "
    "PyFuncStateless (No registered 'PyFuncStateless' OpKernel for XLA_CPU_JIT devices compatible with node {{node x}})"
)
SHAPES = "tf2xla conversion failed while converting __inference_xla_loop_1[]: Expected size[2] in [0, 3], but got 4"


def cfg(jit):
    return OmegaConf.create({"train": {"jit_compile": jit}})


def test_an_op_without_an_xla_kernel_is_named_in_one_paragraph():
    told = refused(RuntimeError(UNSUPPORTED), cfg(True), trained=False)
    assert isinstance(told, ConfigError) and told.exit_code == 2 and told.trained_nothing
    assert "no XLA_CPU_JIT kernel for the op PyFuncStateless" in str(told) and "train.jit_compile unset" in str(told)


def test_the_op_is_found_where_tensorflow_chained_it():
    try:
        try:
            raise ValueError(UNSUPPORTED)
        except ValueError as inner:
            raise RuntimeError("Graph execution error:") from inner
    except RuntimeError as outer:
        assert refused(outer, cfg(True), trained=False) is not None


def test_other_failures_keep_their_own_error():
    assert refused(RuntimeError(SHAPES), cfg(True), trained=False) is None  # a compile failure, not a missing kernel
    assert refused(RuntimeError(UNSUPPORTED), cfg(None), trained=False) is None  # XLA not asked for: Keras 3's own
    assert refused(RuntimeError(UNSUPPORTED), cfg(True), trained=True) is None  # after steps ran: what they did is kept
