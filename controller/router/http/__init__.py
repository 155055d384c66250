"""The controller's HTTP front end: OpenAI's API, health and Prometheus metrics."""
