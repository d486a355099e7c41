"""SPEC §3b's per-event rules: URLs, hosts, campaigns and devices."""

from __future__ import annotations

import pytest

from sessionize_assets.transforms.attributes import (
    EventAttributes,
    event_attributes,
    url_campaign,
    url_host,
)


@pytest.mark.parametrize(
    ("url", "host"),
    [
        ("https://www.Example.COM/a", "example.com"),
        ("HTTPS://WWW.GOOGLE.CO.UK/search?q=x", "google.co.uk"),
        ("http://user:secret@shop.example.io:8443/cart", "shop.example.io"),
        ("//cdn.example.com/p", "cdn.example.com"),
        ("https://m.facebook.com", "m.facebook.com"),
        ("https://www2.example.com", "www2.example.com"),
        ("http://www./", None),  # nothing left once www. is removed
        ("www.google.com/search", None),  # no scheme: a path, not a host
        ("not a url", None),
        ("mailto:someone@example.com", None),
        ("http://[::1", None),  # urlsplit cannot parse it
        ("http://[::1]:8080/", "::1"),
        ("https://", None),
        ("", None),
        (None, None),
    ],
)
def test_a_urls_host_is_urlsplits_without_www(url, host):
    assert url_host(url) == host


def test_utm_parameters_are_form_decoded_first_occurrence_and_empty_is_none():
    url = (
        "https://shop.example/?utm_source=news+letter&utm_source=second"
        "&utm_medium=%45mail&utm_campaign=black%20friday%21&utm_term=&utm%5Fcontent=hero#top"
    )
    assert url_campaign(url) == ("news letter", "Email", "black friday!", None, "hero")


@pytest.mark.parametrize(
    "url",
    ["https://shop.example/", "https://shop.example/?utm_source", "not a url", "http://[::1", None],
)
def test_a_url_without_utm_parameters_has_none(url):
    assert url_campaign(url) == (None, None, None, None, None)


def test_an_empty_first_occurrence_wins_over_a_later_value():
    assert url_campaign("https://a.example/?utm_medium=&utm_medium=cpc")[1] is None


def test_page_fields_come_from_properties_else_context_page_each_on_its_own():
    attributes = event_attributes(
        {"url": "https://www.shop.example/?utm_medium=cpc", "path": ""},
        {
            "page": {"path": "/from-context", "referrer": "https://www.Google.com/", "url": "x"},
            "userAgent": "Mozilla/5.0",
        },
    )
    assert attributes == EventAttributes(
        page_url="https://www.shop.example/?utm_medium=cpc",
        page_path="/from-context",
        page_referrer="https://www.Google.com/",
        page_host="shop.example",
        referrer_host="google.com",
        url_campaign=(None, "cpc", None, None, None),
        device_type="web",
    )


def test_a_campaign_object_is_kept_field_by_field_even_with_nothing_set():
    ctx = {"campaign": {"source": "ads", "medium": "", "name": "spring", "term": 3}}
    assert event_attributes({}, ctx).campaign == ("ads", None, "spring", None, None)
    assert event_attributes({}, {"campaign": {"other": "x"}}).campaign == (None,) * 5
    assert event_attributes({}, {"campaign": {}}).campaign is None
    assert event_attributes({}, {"campaign": "spring"}).campaign is None


def test_the_device_is_its_type_else_web_for_a_user_agent():
    assert event_attributes({}, {"device": {"type": "ios"}, "userAgent": "UA"}).device_type == "ios"
    assert event_attributes({}, {"device": {"type": ""}, "userAgent": "UA"}).device_type == "web"
    assert event_attributes({}, {"device": "phone"}).device_type is None
    assert event_attributes({}, {"os": {"name": "Android"}}).os_name == "Android"
    assert event_attributes({}, {"os": {"name": 14}}).os_name is None


@pytest.mark.parametrize("bad", [None, [], "text", 3, ["url"], True])
def test_properties_or_context_that_are_not_objects_count_as_empty(bad):
    assert event_attributes(bad, bad) == EventAttributes()
    assert event_attributes(bad, {"page": {"url": "https://a.example"}}).page_url == (
        "https://a.example"
    )
    assert event_attributes({"url": "https://b.example"}, bad).page_host == "b.example"
    assert event_attributes({}, {"page": bad, "device": bad, "os": bad}) == EventAttributes()
