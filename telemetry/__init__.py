"""The pieces of process plumbing that the reconciler, the router and the node agent all
ship: JSON-lines logging, the /metrics, /healthz and /readyz server, and the query of a
Kubernetes watch.

The programs ship as separate images and meet only through the API server, so none may
import another; what they share lives here instead. This package imports neither of them,
nor kr8s: each program's own kube module stays its only API client.
"""
