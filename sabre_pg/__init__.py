"""sabre-pg: SABRE t-closeness anonymization inside PostgreSQL.

The Python API (:mod:`sabre_pg.api`: ``anonymize``, ``verify``, ``estimate``, ``runs``,
``stream_advance``, ``Run``) and the errors (:mod:`sabre_pg.errors`) are imported on first use, so
``import sabre_pg`` needs neither pandas nor SQLAlchemy.
"""

__version__ = "0.2.0"

_API = ("anonymize", "verify", "estimate", "runs", "reflect", "Run", "stream_advance")
_ERRORS = ("SabreError", "DatabaseError", "MissingExtra", "InvalidParameter", "UndefinedObject",
           "InsufficientPrivilege", "ObjectInUse", "SourceChanged")
__all__ = ["__version__", *_API, *_ERRORS]


def __getattr__(name):
    if name in _API or name in _ERRORS:
        from importlib import import_module

        value = getattr(import_module("sabre_pg.api" if name in _API else "sabre_pg.errors"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'sabre_pg' has no attribute {name!r}")


def __dir__():
    return sorted(__all__)
