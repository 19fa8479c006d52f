"""Prices per GPU-hour: the collector config's ``prices:`` section and the table it becomes.

A price is looked up by GPU model, price tier (``on-demand``, ``spot``, ``reserved``) and,
optionally, the node's cluster (its agent's ``gpuwarden.cluster`` resource attribute) or region
(its agent's ``cloud.region``)::

    prices:
      currency: EUR                  # ISO 4217 code; default USD
      models:                        # GPU model -> tier -> price per GPU-hour
        H100 NVL: {on-demand: 4.40, spot: 1.80}
        H100: {on-demand: 3.70, spot: 1.50, reserved: 2.40}
        A100: {on-demand: 2.30}
      default: {on-demand: 1.80, spot: 0.70, reserved: 1.20}   # models not listed
      clusters:                      # per-cluster overrides, same keys
        onprem:
          default: {on-demand: 0.90}
      regions:                       # per-region overrides (cloud.region), same keys
        eu-north-1:
          models: {H100: {on-demand: 3.20}}

**How a GPU model matches.** A key of ``models`` matches every NVML model name (``hw.model``,
e.g. ``NVIDIA H100 80GB HBM3``) that contains it, ignoring case; the first key that matches, in
the order written, wins. Write the specific names first (``H100 NVL`` before ``H100``): a key
that an earlier key already covers could never match and is a load error.

**Which price applies**, first found: the cluster's ``models``, the cluster's ``default``, the
region's ``models``, the region's ``default``, the fleet's ``models``, the fleet's
``default``. Within an entry a tier not written costs the entry's ``on-demand`` price (required
in every entry), and so does a tier the table does not know (a job label such as
``preemptible``).

**Without the section** (or for the keys left out) the built-in table applies:
:data:`BUILTIN_MODELS` and :data:`BUILTIN_DEFAULT`, in US dollars. They cannot be mixed with
another currency: with ``currency`` other than USD, ``models`` and ``default`` are required.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Annotated, Literal

import msgspec

TIERS = ("on-demand", "spot", "reserved")
PriceTier = Literal["on-demand", "spot", "reserved"]
BUILTIN_SOURCE = "built-in default"
DEFAULT_MODEL = "(default)"
"""The ``gpu_model`` shown for a table's price of the models it does not list."""

Tiers = Mapping[str, float]
"""Tier → price per GPU-hour, every tier of :data:`TIERS` present."""


def _tiers(on_demand: float, spot: float, reserved: float) -> Tiers:
    return MappingProxyType({"on-demand": on_demand, "spot": spot, "reserved": reserved})


#: The built-in prices (US dollars per GPU-hour), used for what the config does not say.
BUILTIN_MODELS: Mapping[str, Tiers] = MappingProxyType(
    {
        "h100": _tiers(4.00, 1.60, 2.60),
        "a100": _tiers(2.50, 1.00, 1.60),
        "l4": _tiers(0.80, 0.30, 0.50),
    }
)
BUILTIN_DEFAULT: Tiers = _tiers(2.00, 0.80, 1.30)


def _lookup(models: Mapping[str, Tiers], model: str) -> Tiers | None:
    lowered = model.lower()
    for pattern, tiers in models.items():
        if pattern.lower() in lowered:
            return tiers
    return None


def _tier(tiers: Tiers, tier: str) -> float:
    return tiers.get(tier, tiers["on-demand"])


@dataclass(frozen=True, slots=True)
class ClusterPrices:
    """One cluster's overrides: its own ``models`` and, optionally, its ``default``."""

    models: Mapping[str, Tiers] = field(default_factory=lambda: MappingProxyType({}))
    default: Tiers | None = None


@dataclass(frozen=True, slots=True)
class PriceRow:
    """One line of the effective table (``cluster`` and ``region`` "" = the whole fleet)."""

    cluster: str
    gpu_model: str
    tier: str
    price_per_hour: float
    region: str = ""


@dataclass(frozen=True, slots=True)
class PriceTable:
    """Prices per GPU-hour in ``currency`` by GPU model, tier and cluster (see the module).

    ``source`` says where the table came from: the config file or :data:`BUILTIN_SOURCE`.
    """

    models: Mapping[str, Tiers] = field(default_factory=lambda: BUILTIN_MODELS)
    default: Tiers = field(default_factory=lambda: BUILTIN_DEFAULT)
    currency: str = "USD"
    clusters: Mapping[str, ClusterPrices] = field(default_factory=lambda: MappingProxyType({}))
    source: str = BUILTIN_SOURCE
    #: per-region overrides (the agents' ``cloud.region``), below a cluster's
    regions: Mapping[str, ClusterPrices] = field(default_factory=lambda: MappingProxyType({}))

    def price(
        self, model: str, tier: str, cluster: str | None = None, region: str | None = None
    ) -> float:
        """Price per GPU-hour of this model at this tier, on a node of ``cluster`` and
        ``region`` if known."""
        for scope, name in ((self.clusters, cluster), (self.regions, region)):
            local = scope.get(name) if name else None
            if local is not None:
                tiers = _lookup(local.models, model) or local.default
                if tiers is not None:
                    return _tier(tiers, tier)
        return _tier(_lookup(self.models, model) or self.default, tier)

    def rows(self) -> list[PriceRow]:
        """The table as written: the fleet, then each cluster's, then each region's overrides
        (sorted)."""
        out: list[PriceRow] = []
        scopes: list[tuple[str, str, Mapping[str, Tiers], Tiers | None]] = [
            ("", "", self.models, self.default)
        ]
        scopes += [(name, "", c.models, c.default) for name, c in sorted(self.clusters.items())]
        scopes += [("", name, r.models, r.default) for name, r in sorted(self.regions.items())]
        for cluster, region, models, default in scopes:
            entries = [*models.items(), *([(DEFAULT_MODEL, default)] if default else [])]
            for gpu_model, tiers in entries:
                out += [PriceRow(cluster, gpu_model, t, tiers[t], region) for t in TIERS]
        return out


# --- the configuration section -----------------------------------------------------------------

Price = Annotated[float, msgspec.Meta(ge=0, description="a price per GPU-hour >= 0")]
ModelKey = Annotated[str, msgspec.Meta(min_length=1)]
Currency = Annotated[
    str,
    msgspec.Meta(pattern="^[A-Z]{3}$", description="an ISO 4217 currency code such as USD, EUR"),
]


class TierPricesSection(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``{on-demand: 4.0, spot: 1.6, reserved: 2.6}``: tiers not written cost ``on-demand``."""

    on_demand: Price = msgspec.field(name="on-demand")
    spot: Price | None = None
    reserved: Price | None = None

    def tiers(self) -> Tiers:
        """Every tier's price."""
        return _tiers(
            self.on_demand,
            self.on_demand if self.spot is None else self.spot,
            self.on_demand if self.reserved is None else self.reserved,
        )


def _shadowed(models: Mapping[str, TierPricesSection] | None) -> str | None:
    """The problem with the first model key an earlier key already covers, if any."""
    seen: list[str] = []
    for key in models or {}:
        earlier = next((s for s in seen if s.lower() in key.lower()), None)
        if earlier is not None:
            return (
                f"models: {key!r} can never match: {earlier!r} comes first and matches every "
                "name it does (write the longer name first)"
            )
        seen.append(key)
    return None


class ClusterPricesSection(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``prices.clusters.<name>`` or ``prices.regions.<name>``: its ``models`` and ``default``."""

    models: Mapping[ModelKey, TierPricesSection] = msgspec.field(
        default_factory=lambda: MappingProxyType({})
    )
    default: TierPricesSection | None = None

    def __post_init__(self) -> None:
        if problem := _shadowed(self.models):
            raise ValueError(problem)


class PricesSection(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The ``prices:`` section as written (see the module)."""

    currency: Currency = "USD"
    models: Mapping[ModelKey, TierPricesSection] | None = None
    default: TierPricesSection | None = None
    clusters: Mapping[Annotated[str, msgspec.Meta(min_length=1)], ClusterPricesSection] = (
        msgspec.field(default_factory=lambda: MappingProxyType({}))
    )
    regions: Mapping[Annotated[str, msgspec.Meta(min_length=1)], ClusterPricesSection] = (
        msgspec.field(default_factory=lambda: MappingProxyType({}))
    )

    def __post_init__(self) -> None:
        if problem := _shadowed(self.models):
            raise ValueError(problem)
        if self.currency != "USD":
            for key in ("models", "default"):
                if getattr(self, key) is None:
                    raise ValueError(
                        f"{key}: required with currency {self.currency} (the built-in prices "
                        "are US dollars)"
                    )

    def table(self, source: str) -> PriceTable:
        """The effective table; keys left out keep the built-in prices."""
        models = (
            BUILTIN_MODELS
            if self.models is None
            else MappingProxyType({k: v.tiers() for k, v in self.models.items()})
        )
        return PriceTable(
            models=models,
            default=BUILTIN_DEFAULT if self.default is None else self.default.tiers(),
            currency=self.currency,
            clusters=_scopes(self.clusters),
            source=source,
            regions=_scopes(self.regions),
        )


def _scopes(written: Mapping[str, ClusterPricesSection]) -> Mapping[str, ClusterPrices]:
    return MappingProxyType(
        {
            name: ClusterPrices(
                models=MappingProxyType({k: v.tiers() for k, v in c.models.items()}),
                default=None if c.default is None else c.default.tiers(),
            )
            for name, c in written.items()
        }
    )
