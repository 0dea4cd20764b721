"""Node-side helpers (stdlib only at import)."""
