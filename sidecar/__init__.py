"""The modelpool router: an OpenAI-compatible proxy that hosts the activator."""
