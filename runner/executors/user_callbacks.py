"""executor.callbacks (executor=fit): a user's own callbacks of the model's Keras, made by Hydra's instantiate and
checked."""


def build_callbacks(specs, keras=None) -> list:
    """executor.callbacks, instantiated (Hydra's instantiate); each must be a callback of `keras` (the model's Keras:
    tf_keras when not given, or Keras 3), else a ConfigError naming its key. After TensorFlow's import (a callback's
    module imports its Keras), before the first step."""
    if keras is None:
        import tf_keras as keras
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate

    from runner.errors import ConfigError, runners_own

    made = []
    for i, spec in enumerate(specs or []):
        target = spec.get("_target_") if hasattr(spec, "get") else None
        key = f"executor.callbacks[{i}]"
        if not target:
            raise ConfigError(f"{key}={spec} has no _target_: give each callback as {{_target_: module.Class, ...}}.")
        try:
            callback = instantiate(spec)
        except InstantiationException as err:
            stop = runners_own(err)
            if stop is not None:  # Hydra wraps whatever the call raised: a stop (Ctrl-C) inside it is the stop
                raise stop from None
            said = str(err).strip().splitlines()[0]
            raise ConfigError(
                f"{key}._target_={target} could not be made ({said}). Check the dotted path and its arguments."
            ) from None
        if not isinstance(callback, keras.callbacks.Callback):
            if keras.__name__ == "tf_keras":
                why = "subclass tf_keras.callbacks.Callback (the runner trains a tf_keras model with tf_keras, Keras 2)."
            else:
                why = "subclass keras.callbacks.Callback (the model is a Keras 3 one, and Keras 3's fit trains it)."
            raise ConfigError(
                f"{key}._target_={target} returned {type(callback).__name__}, not a {keras.__name__}.callbacks.Callback: " + why
            )
        made.append(callback)
    return made
