"""The Kubernetes API as every program here speaks it: the reconciler, the router and the
local testbed's node agent each have one kube module, a thin layer of this package.

- `client`: the call wrapper on a kr8s `Api`: kr8s never reads a refusal itself, a 401
  renews the token on the same session, and every failure comes out in the program's own
  errors. The only module here that imports kr8s.
- `refusal`: what the API server said when it refused a request, and the token renewal.
- `watch`: list, then watch (resourceVersion, bookmarks, a new list after 410 Gone).
- `pool_request`: the compare-and-swap on a ModelPool's `status.request`.

The programs ship as separate images and meet only through the API server, so none may
import another; this package imports none of them.
"""
