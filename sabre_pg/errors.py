"""Exceptions raised by the sabre-pg client (the CLI prints them without a traceback)."""


class SabreError(Exception):
    """A failure with a message meant for the user."""
