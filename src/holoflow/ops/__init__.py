"""Op declarations: the only place that knows individual ops (docs/architecture.md, "The op declaration")."""
