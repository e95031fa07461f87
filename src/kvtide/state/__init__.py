"""Where shared router state lives: index stores (in process, Redis) and KV-event intake."""
