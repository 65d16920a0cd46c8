"""Applications the daemon can run (``rebaser-server --app module:attr``)."""
