"""End-to-end tests: the whole system installed from its manifests, driven through its
public surfaces (kubectl, the OpenAI SDK against the router pod, /metrics)."""
