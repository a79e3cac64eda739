"""An interpolation that cannot be resolved (`${...}`: a missing key, an unset environment variable, an unknown
resolver, a cycle, a value of the wrong type), named in one paragraph: the key, what it holds and what to do,
rather than OmegaConf's traceback from wherever the value is first read."""

import re

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import (
    InterpolationResolutionError,
    InterpolationToMissingValueError,
    OmegaConfBaseException,
    UnsupportedInterpolationType,
)

from runner.config.redact import visible

LIST_KEYS = "python -m runner --cfg job lists the keys"


def _raw(cfg, key: str):
    """The value `key` holds before resolution (the `${...}` text), or None."""
    node = OmegaConf.to_container(cfg, resolve=False)
    for part in re.findall(r"[^.\[\]]+", key or ""):
        if isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:  # a key OmegaConf's message names otherwise: the paragraph goes without its value
            return None
    return node if key else None


def explain(err: OmegaConfBaseException, cfg=None, overrides=()) -> str | None:
    """One paragraph for an interpolation error (None for any other OmegaConf error). Without `cfg` (OmegaConf's
    resolve names no key), the override of `overrides` that holds the interpolation stands for the key."""
    if not isinstance(err, InterpolationResolutionError | UnsupportedInterpolationType):  # their subclasses too
        return None
    full = str(err)
    key = getattr(err, "full_key", None) or next(iter(re.findall(r"full_key: (\S+)", full)), "")
    raw = _raw(cfg, key) if cfg is not None else None
    shown = visible(f"{key}={raw}" if raw is not None else (key or "a value"))
    text = visible((getattr(err, "msg", None) or full).splitlines()[0])
    missing = re.search(r"Interpolation key '([^']+)' not found", text)
    env = re.search(r"Environment variable '([^']+)' not found", text)
    resolver = re.search(r"Unsupported interpolation type (\S+)", text)
    if not key and raw is None:
        token = next((m.group(1) for m in (missing, env, resolver) if m), None)
        held = [o for o in overrides if "${" in o and (token is None or token in o)]
        shown = visible(held[0]) if len(held) == 1 else shown
    if missing:
        what = f"refers to {missing.group(1)}, which is no key of the config: name an existing key ({LIST_KEYS})"
    elif env:
        name = env.group(1)
        what = f"reads the environment variable {name}, which is not set: set it, or give a default: ${{oc.env:{name},<default>}}"
    elif resolver:
        what = f"calls the resolver {resolver.group(1)!r}, which is not registered: use oc.env, oc.select or a plain value"
    elif "Recursive interpolation" in text:
        what = "refers back to itself (an interpolation cycle): give one of the keys in the cycle a plain value"
    elif isinstance(err, InterpolationToMissingValueError):
        what = f"refers to a key that is not set ({text}): set that key too"
    else:
        what = f"could not be resolved ({text}): fix the interpolation, or give a plain value"
    return f"{shown}: the interpolation {what}."


def check(cfg: DictConfig) -> str | None:
    """The first unresolvable interpolation in `cfg`, explained; None when every one resolves."""
    try:
        OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as err:
        return explain(err, cfg)
    return None
