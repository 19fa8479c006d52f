"""Optional extras: the client libraries only some sites install.

``gpuwarden[kubernetes]`` (the Kubernetes job source and actuators) and ``gpuwarden[slack]``
(the Slack notifier) are not part of ``gpuwarden[collector]``: a Slurm-only site does not
install them. Their adapter modules are imported only when a setting enables them, inside
:func:`needs_extra`, which turns the import failure into a start-up error naming the setting
and the extra to install.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from types import MappingProxyType

from gpuwarden.agent.config import ConfigError

EXTRA_MODULES: Mapping[str, frozenset[str]] = MappingProxyType(
    {
        "kubernetes": frozenset({"kubernetes"}),
        "slack": frozenset({"slack_sdk"}),
        "collector": frozenset(
            {"numpy", "pandas", "scipy", "statsmodels", "aiohttp", "jinja2", "psycopg"}
        ),
    }
)
"""Extra → the top-level modules it installs that our adapters import."""


class MissingExtraError(ConfigError):
    """A setting enables an adapter whose extra is not installed.

    Attributes:
        setting: the config key (or, with ``environment``, the variable) that enabled it.
        extra: the name in ``gpuwarden[<extra>]``.
        environment: the setting is an environment variable, not a key of the config file.
    """

    def __init__(self, setting: str, extra: str, *, environment: bool = False) -> None:
        super().__init__(f"{setting}: needs the {extra!r} extra: pip install 'gpuwarden[{extra}]'")
        self.setting = setting
        self.extra = extra
        self.environment = environment


@contextmanager
def needs_extra(extra: str, setting: str, *, environment: bool = False) -> Iterator[None]:
    """Import an adapter of ``extra`` inside this block, for ``setting``.

    A ``ModuleNotFoundError`` for one of the extra's modules becomes :class:`MissingExtraError`;
    any other missing module (a broken install) propagates unchanged.
    """
    try:
        yield
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] not in EXTRA_MODULES[extra]:
            raise
        raise MissingExtraError(setting, extra, environment=environment) from None
