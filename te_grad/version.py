"""te_grad's version: one place, imported by the facade, the exporter and the disk cache."""
__version__ = "0.1.0"
