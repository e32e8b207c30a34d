"""The request rules of /ingest as plain functions (tiny.handlers.rules): the key, the token,
the head's checks in order, the body limit as streamed, gzip."""

from __future__ import annotations

import gzip

import pytest
from tornado.httputil import HTTPHeaders

from tiny.handlers.base import APIError, check_token
from tiny.handlers.rules import PROXY_KEY_HEADER, Head, IngestRules, gunzip, idempotency_key
from tiny.limits import MAX_GZIP_MEMBERS


def status(call: object) -> int:
    with pytest.raises(APIError) as raised:
        call()  # type: ignore[operator]
    return raised.value.status_code


@pytest.mark.parametrize("value", ["", " ", "x" * 256, "with space", "é", "tab\there", '""'])
def test_a_key_must_be_1_to_255_visible_ascii_characters(value: str) -> None:
    assert status(lambda: idempotency_key([value])) == 400


def test_a_key_may_be_quoted_and_is_then_the_same_key() -> None:
    assert idempotency_key(['"quoted"']) == idempotency_key(["quoted"]) == "quoted"
    assert idempotency_key(["~" * 255]) == "~" * 255
    assert idempotency_key([]) is None


def test_a_key_sent_twice_is_refused_even_when_both_are_the_same() -> None:
    assert status(lambda: idempotency_key(["a", "a"])) == 400


def test_the_head_is_checked_in_order_method_token_key_encoding_type_length_framing() -> None:
    rules = IngestRules(max_body=100, token="t")
    bad = HTTPHeaders({"Idempotency-Key": "a b", "Content-Encoding": "br", "Content-Length": "1000"})
    assert status(lambda: rules.head("GET", bad)) == 405
    assert status(lambda: rules.head("POST", bad)) == 401
    bad["Authorization"] = "Bearer t"
    assert status(lambda: rules.head("POST", bad)) == 400
    del bad["Idempotency-Key"]
    assert status(lambda: rules.head("POST", bad)) == 415
    bad["Content-Encoding"] = "gzip"
    bad["Content-Type"] = "text/html"
    assert status(lambda: rules.head("POST", bad)) == 415
    bad["Content-Type"] = "application/x-ndjson; charset=utf-8"
    assert status(lambda: rules.head("POST", bad)) == 413
    bad["Content-Length"] = "ten"
    assert status(lambda: rules.head("POST", bad)) == 400
    del bad["Content-Length"]
    assert status(lambda: rules.head("POST", bad)) == 411
    bad["Content-Length"] = "100"
    assert rules.head("POST", bad) == Head(key=None, gzip=True)


@pytest.mark.parametrize("declared", ["ten", "-1", "+5", "5_9", "5,5", "5 5", "\u0665", ""])
def test_a_content_length_is_decimal_digits_only(declared: str) -> None:
    rules = IngestRules(max_body=100, token=None)
    assert status(lambda: rules.head("POST", HTTPHeaders({"Content-Length": declared}))) == 400


def test_a_content_length_is_compared_with_the_limit_as_digits() -> None:
    rules = IngestRules(max_body=100, token=None)
    assert rules.head("POST", HTTPHeaders({"Content-Length": "0" * 17 + "100"})) == Head(None, False)
    for over in ("101", "999", "1000", "0101", "9" * 5000):
        assert status(lambda over=over: rules.head("POST", HTTPHeaders({"Content-Length": over}))) == 413
    assert status(lambda: rules.head("POST", HTTPHeaders({"Content-Length": "0" * 5000 + "100"}))) == 400


@pytest.mark.parametrize(
    "framing",
    [
        {"Transfer-Encoding": "identity"},
        {"Transfer-Encoding": "gzip, chunked"},
        {"Transfer-Encoding": "chunked", "Content-Length": "5"},
    ],
)
def test_a_transfer_encoding_is_chunked_alone_or_absent(framing: dict[str, str]) -> None:
    rules = IngestRules(max_body=100, token=None)
    assert status(lambda: rules.head("POST", HTTPHeaders(framing))) == 400
    assert rules.head("POST", HTTPHeaders({"Transfer-Encoding": "Chunked"})) == Head(None, False)


def test_the_proxy_key_counts_only_without_the_clients_own() -> None:
    rules = IngestRules(max_body=100, token=None)
    assert rules.head("POST", HTTPHeaders({PROXY_KEY_HEADER: "p", "Content-Length": "5"})).key == "p"
    both = HTTPHeaders({PROXY_KEY_HEADER: "p", "Idempotency-Key": "c", "Content-Length": "5"})
    assert rules.head("POST", both).key == "c"


def test_the_body_limit_holds_as_the_body_streams_in() -> None:
    rules = IngestRules(max_body=100, token=None)
    assert rules.over_limit(100) is None
    refused = rules.over_limit(101)
    assert refused is not None and refused.status_code == 413


def test_the_token_scheme_is_case_insensitive_and_the_token_is_not() -> None:
    check_token(None, "")
    check_token("t", "bearer t")
    check_token("t", "  BEARER  t ")
    for sent in ("", "Bearer T", "Basic t", "Bearer", "t"):
        assert status(lambda sent=sent: check_token("t", sent)) == 401


def test_gunzip_reads_every_member_and_holds_the_limit() -> None:
    assert gunzip(gzip.compress(b"ab") + gzip.compress(b"cd"), 4) == b"abcd"
    assert status(lambda: gunzip(gzip.compress(b"abcde"), 4)) == 413
    assert status(lambda: gunzip(gzip.compress(b"ab")[:-3], 4)) == 400
    assert status(lambda: gunzip(b"not gzip", 4)) == 400
    assert status(lambda: gunzip(gzip.compress(b"") * (MAX_GZIP_MEMBERS + 1), 100)) == 413


def test_decode_leaves_an_identity_body_as_it_is() -> None:
    rules = IngestRules(max_body=10, token=None)
    assert rules.decode(b"raw", Head(None, False)) == b"raw"
    assert rules.decode(gzip.compress(b"raw"), Head(None, True)) == b"raw"
