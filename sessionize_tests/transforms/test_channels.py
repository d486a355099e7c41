"""SPEC §3b's channel rules, in Python and as the Spark expression built from the same rules."""

from __future__ import annotations

import pytest
from pyspark.sql import functions as F

from sessionize_assets.transforms.channels import CHANNELS, channel, channel_sql

# (utm_source, utm_medium, referrer_host, landing_host) -> channel
CASES = [
    ((None, "CPC", "google.com", None), "Paid Search"),
    ((None, "paid_search", None, None), "Paid Search"),
    (("fb", "PaidSocial", None, None), "Paid Social"),
    ((None, "e-mail", None, None), "Email"),
    ((None, "newsletter", "t.co", None), "Email"),
    ((None, "affiliate", None, None), "Affiliate"),
    ((None, "cpm", None, None), "Display"),
    ((None, "social-network", None, None), "Organic Social"),
    ((None, None, "m.facebook.com", "shop.example"), "Organic Social"),
    ((None, None, "x.com", None), "Organic Social"),
    ((None, None, "google.co.uk", "shop.example"), "Organic Search"),
    ((None, None, "search.yahoo.com", None), "Organic Search"),
    ((None, None, "yahoo.com", None), "Referral"),
    ((None, None, "news.example", "shop.example"), "Referral"),
    ((None, None, "shop.example", "shop.example"), "Direct"),  # internal referrer
    (("partner", None, "shop.example", "shop.example"), "Other Campaign"),
    ((None, "print", None, None), "Other Campaign"),
    ((None, None, None, None), "Direct"),
    ((None, None, None, "shop.example"), "Direct"),
    ((None, "organic", "googlemail.com", None), "Referral"),  # google. is a prefix with a dot
]


@pytest.mark.parametrize(("values", "expected"), CASES)
def test_the_first_rule_that_holds_names_the_channel(values, expected):
    source, medium, host, landing = values
    assert (
        channel(utm_source=source, utm_medium=medium, referrer_host=host, landing_host=landing)
        == expected
    )


def test_the_spark_expression_agrees_with_the_rules(spark):
    rows = [(i, *values) for i, (values, _) in enumerate(CASES)]
    frame = spark.createDataFrame(
        rows, "i int, utm_source string, utm_medium string, referrer_host string, landing string"
    )
    got = frame.select(
        "i",
        F.expr(
            channel_sql(
                utm_source="utm_source",
                utm_medium="utm_medium",
                referrer_host="referrer_host",
                landing_host="landing",
            )
        ).alias("channel"),
    ).collect()
    assert [r.channel for r in sorted(got, key=lambda r: r.i)] == [e for _, e in CASES]
    assert {e for _, e in CASES} == set(CHANNELS)
