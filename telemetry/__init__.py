"""The pieces of process plumbing that the reconciler, the router and the node agent all
ship: JSON-lines logging and the /metrics, /healthz and /readyz server.

The programs ship as separate images and meet only through the API server, so none may
import another; what they share lives here instead (and their talk to the API server in
`kubecore`). This package imports neither of them, nor kr8s.
"""
