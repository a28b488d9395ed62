"""The local testbed (a real control plane, a node agent that plays the kubelet) and the
fake model server."""
