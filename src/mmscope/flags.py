"""Every on/off switch mmscope reads from the environment, read one way.

`1`, `true`, `yes` and `on` turn a switch on; `0`, `false`, `no`, `off` and the empty string turn
it off (any case, spaces ignored); any other value keeps the switch's default, with one warning.
"""
from __future__ import annotations

import os

from mmscope.log import logger

ON = frozenset({"1", "true", "yes", "on"})
OFF = frozenset({"0", "false", "no", "off", ""})

_warned: set[str] = set()


def flag(name: str, default: bool = False) -> bool:
    """The switch `name`: its value in the environment, or `default` when unset or unreadable."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in ON:
        return True
    if value in OFF:
        return False
    if name not in _warned:
        _warned.add(name)
        logger.warning("mmscope: %s=%r is neither on (1, true, yes, on) nor off (0, false, no, "
                       "off); it stays %s", name, raw, "on" if default else "off")
    return default
