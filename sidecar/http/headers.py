"""Which header lines a proxy passes on: the client's to the upstream, the upstream's back.

Hop-by-hop fields (RFC 9110 section 7.6.1), and whatever `Connection` lists, stay on their
own connection; the framing is written anew on each side.
"""

from __future__ import annotations

# RFC 9110 section 7.6.1 connection-specific fields, plus the proxy ones. Header names
# are compared as bytes, lower-cased, as they come off the wire.
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)
# Written by the client from the body it sends; never copied from the client.
_REQUEST_OWN = frozenset({b"host", b"content-length", b"expect"})
_REQUEST_SKIP = HOP_BY_HOP | _REQUEST_OWN
# Written by the router's server for the client.
_RESPONSE_SKIP = HOP_BY_HOP | {b"content-length", b"date"}


_NOTHING: frozenset[bytes] = frozenset()
RawHeaders = list[tuple[bytes, bytes]]


def request_headers(raw: RawHeaders, *, drop: frozenset[bytes] = _NOTHING) -> bytes:
    """The client's header lines minus hop-by-hop ones, whatever `Connection` lists and
    any in `drop` (lower-case names), ready to send."""
    if not drop:
        return _lines(raw, *_REQUEST_SKIPPING)
    skipping = _with_dropped.get(drop)
    if skipping is None:  # callers pass one of a few constant sets
        skipping = _with_dropped[drop] = _skipping(_REQUEST_SKIP | drop)
    return _lines(raw, *skipping)


def response_headers(raw: RawHeaders) -> bytes:
    """The upstream's header lines minus hop-by-hop ones, whatever `Connection` lists, and
    the framing the router writes itself (`Content-Length`, `Date`), ready to send."""
    return _lines(raw, *_RESPONSE_SKIPPING)


_Skipping = tuple[frozenset[bytes], frozenset[int]]


def _skipping(names: frozenset[bytes]) -> _Skipping:
    """A set of names to skip, with the lengths of its names."""
    return names, frozenset(len(name) for name in names)


_RESPONSE_SKIPPING = _skipping(_RESPONSE_SKIP)
_REQUEST_SKIPPING = _skipping(_REQUEST_SKIP)
# The request's names to skip with each set of further names dropped (`request_headers`).
_with_dropped: dict[frozenset[bytes], _Skipping] = {}


def _lines(raw: RawHeaders, skip: frozenset[bytes], sizes: frozenset[int]) -> bytes:
    kept = []
    listed: frozenset[bytes] | None = None  # named by `Connection`, beyond hop-by-hop
    for name, value in raw:
        if len(name) not in sizes:  # no name to skip is this long: no need to lower it
            kept.append(b"%s: %s\r\n" % (name, value))
            continue
        low = name.lower()
        if low in skip:
            if low == b"connection":
                tokens = _connection_tokens(value)
                if tokens:
                    listed = tokens if listed is None else listed | tokens
        else:
            kept.append(b"%s: %s\r\n" % (name, value))
    if listed is None:
        return b"".join(kept)
    return b"".join([b"%s: %s\r\n" % (name, value) for name, value in raw
                     if (low := name.lower()) not in skip and low not in listed])


_TOKENS: dict[bytes, frozenset[bytes]] = {}


def _connection_tokens(value: bytes) -> frozenset[bytes]:
    """The header names a `Connection` value lists, beyond the hop-by-hop ones."""
    tokens = _TOKENS.get(value)
    if tokens is None:
        tokens = frozenset(t.strip().lower() for t in value.split(b",") if t.strip())
        tokens -= HOP_BY_HOP
        if len(_TOKENS) < 256:  # the same few values ("keep-alive", "close") recur
            _TOKENS[value] = tokens
    return tokens
