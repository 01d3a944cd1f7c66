"""Op declarations: the only place that knows individual ops (DESIGN §3)."""
