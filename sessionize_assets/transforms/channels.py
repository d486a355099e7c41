"""SPEC §3b's default channel grouping of a session, from its campaign and its referrer.

The rules are data (`CHANNEL_RULES`, first match wins), and both forms of the grouping are
built from them: `channel` in Python (the reference and the tests read it) and `channel_sql`,
Spark SQL text (the sessions pass computes it), so the two cannot drift apart. The text is one
CASE the JVM parses in one call; built from `Column` objects it took hundreds of driver round
trips on every sessions run.
"""

from __future__ import annotations

from dataclasses import dataclass

from sessionize_assets.sql_text import sql_string


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


def channel_sql(*, utm_source: str, utm_medium: str, referrer_host: str, landing_host: str) -> str:
    """`channel` as Spark SQL text over these expressions (SQL text of string values, null
    when not set)."""
    medium = f"lower({utm_medium})"
    host = f"(CASE WHEN NOT ({referrer_host} <=> {landing_host}) THEN {referrer_host} END)"
    branches = []
    for rule in CHANNEL_RULES:
        holds = []
        if rule.mediums:
            holds.append(f"{medium} IN ({', '.join(map(sql_string, rule.mediums))})")
        if rule.hosts:
            holds.append(f"{host} IN ({', '.join(map(sql_string, rule.hosts))})")
        holds.extend(f"startswith({host}, {sql_string(p)})" for p in rule.host_prefixes)
        if rule.any_host:
            holds.append(f"{host} IS NOT NULL")
        if rule.any_campaign:
            holds.append(f"{utm_source} IS NOT NULL OR {utm_medium} IS NOT NULL")
        branches.append(
            f"WHEN coalesce({' OR '.join(f'({h})' for h in holds)}, false) "
            f"THEN {sql_string(rule.channel)}"
        )
    return f"CASE {' '.join(branches)} ELSE {sql_string(DIRECT)} END"
