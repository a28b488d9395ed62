"""HTTP/1.1 for the router, on httptools: the server of its API port (`server`, with the
`messages` a handler reads and writes), the client it calls members with (`client`), the
header rules of a proxy (`headers`), a limit of requests in flight per endpoint (`slots`)
and one-shot checks of an endpoint (`probes`).

Nothing here knows of routing, pools or activation: these modules import nothing else of
the router.
"""
