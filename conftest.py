"""Our own test wiring only (pytester); no plugin logic lives here."""
