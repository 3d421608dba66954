"""sabre-pg: SABRE t-closeness anonymization inside PostgreSQL."""

__version__ = "0.2.0"
