"""executor.callbacks (executor=fit): a user's own tf_keras callbacks, made by Hydra's instantiate and checked."""


def build_callbacks(specs) -> list:
    """executor.callbacks, instantiated (Hydra's instantiate); each must be a tf_keras callback, else a ConfigError
    naming its key. After TensorFlow's import (a callback's module imports tf_keras), before the first step."""
    import tf_keras
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate

    from runner.errors import ConfigError

    made = []
    for i, spec in enumerate(specs or []):
        target = spec.get("_target_") if hasattr(spec, "get") else None
        key = f"executor.callbacks[{i}]"
        if not target:
            raise ConfigError(f"{key}={spec} has no _target_: give each callback as {{_target_: module.Class, ...}}.")
        try:
            callback = instantiate(spec)
        except InstantiationException as err:
            said = str(err).strip().splitlines()[0]
            raise ConfigError(
                f"{key}._target_={target} could not be made ({said}). Check the dotted path and its arguments."
            ) from None
        if not isinstance(callback, tf_keras.callbacks.Callback):
            raise ConfigError(
                f"{key}._target_={target} returned {type(callback).__name__}, not a tf_keras.callbacks.Callback: "
                "subclass tf_keras.callbacks.Callback (the runner trains with tf_keras, Keras 2)."
            )
        made.append(callback)
    return made
