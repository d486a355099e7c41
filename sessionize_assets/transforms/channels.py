"""SPEC §3b's default channel grouping of a session, from its campaign and its referrer.

The rules are data (`CHANNEL_RULES`, first match wins), and both forms of the grouping are
built from them: `channel` in Python (the reference and the tests read it) and
`channel_column` in Spark (the sessions pass computes it), so the two cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column
from pyspark.sql import functions as F


@dataclass(frozen=True)
class ChannelRule:
    """A channel, and when it holds: the lower-cased medium is one of `mediums`, or the
    (external) referrer host is one of `hosts` or starts with one of `host_prefixes`, or
    there is such a host at all (`any_host`), or a source or medium is set (`any_campaign`)."""

    channel: str
    mediums: tuple[str, ...] = ()
    hosts: tuple[str, ...] = ()
    host_prefixes: tuple[str, ...] = ()
    any_host: bool = False
    any_campaign: bool = False


CHANNEL_RULES = (
    ChannelRule("Paid Search", mediums=("cpc", "ppc", "paidsearch", "paid_search")),
    ChannelRule("Paid Social", mediums=("paidsocial", "paid_social", "social_paid")),
    ChannelRule("Email", mediums=("email", "e-mail", "newsletter")),
    ChannelRule("Affiliate", mediums=("affiliate",)),
    ChannelRule("Display", mediums=("display", "banner", "cpm")),
    ChannelRule(
        "Organic Social",
        mediums=("social", "social-network", "social_network"),
        hosts=(
            "facebook.com",
            "m.facebook.com",
            "instagram.com",
            "t.co",
            "twitter.com",
            "x.com",
            "linkedin.com",
            "reddit.com",
            "pinterest.com",
        ),
    ),
    ChannelRule(
        "Organic Search",
        hosts=("bing.com", "duckduckgo.com", "search.yahoo.com", "ecosia.org", "yandex.ru")
        + ("baidu.com",),
        host_prefixes=("google.",),
    ),
    ChannelRule("Referral", any_host=True),
    ChannelRule("Other Campaign", any_campaign=True),
)
DIRECT = "Direct"
CHANNELS = (*(rule.channel for rule in CHANNEL_RULES), DIRECT)


def channel(
    *,
    utm_source: str | None,
    utm_medium: str | None,
    referrer_host: str | None,
    landing_host: str | None,
) -> str:
    """The session's channel: the first rule that holds, else `Direct`. A referrer host equal
    to the landing page's host is internal, and counts as no referrer."""
    medium = utm_medium.lower() if utm_medium is not None else None
    host = None if referrer_host == landing_host else referrer_host
    for rule in CHANNEL_RULES:
        if (
            medium in rule.mediums
            or host in rule.hosts
            or (host is not None and host.startswith(rule.host_prefixes))
            or (rule.any_host and host is not None)
            or (rule.any_campaign and (utm_source is not None or utm_medium is not None))
        ):
            return rule.channel
    return DIRECT


def channel_column(
    *, utm_source: Column, utm_medium: Column, referrer_host: Column, landing_host: Column
) -> Column:
    """`channel` as a Spark expression over these columns (strings, null when not set)."""
    medium = F.lower(utm_medium)
    host = F.when(~referrer_host.eqNullSafe(landing_host), referrer_host)
    result = F.lit(DIRECT)
    for rule in reversed(CHANNEL_RULES):
        holds = F.lit(False)
        if rule.mediums:
            holds = holds | medium.isin(*rule.mediums)
        if rule.hosts:
            holds = holds | host.isin(*rule.hosts)
        for prefix in rule.host_prefixes:
            holds = holds | host.startswith(prefix)
        if rule.any_host:
            holds = holds | host.isNotNull()
        if rule.any_campaign:
            holds = holds | utm_source.isNotNull() | utm_medium.isNotNull()
        result = F.when(F.coalesce(holds, F.lit(False)), F.lit(rule.channel)).otherwise(result)
    return result
