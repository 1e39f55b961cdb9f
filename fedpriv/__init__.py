"""fedpriv: federated learning with differential privacy for small on-device language models."""

__version__ = "0.1.0"
