"""sabre-pg: SABRE t-closeness anonymization inside PostgreSQL."""

__version__ = "0.1.0"
