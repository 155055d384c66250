"""The worker process lifecycle: probe -> register -> build the engine the controller resolved ->
report what was realized -> heartbeat -> serve (and register again when the controller asks)."""
