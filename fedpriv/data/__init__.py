"""Federated datasets: the synthetic default, StackOverflow (TFF sqlite), your own files (``data=files``),
and their common form."""

from fedpriv.data import files, stackoverflow, synthetic  # noqa: F401 (they register their config options)
from fedpriv.data.federated import FederatedDataset, PublicCorpus, Vocabulary

__all__ = ["FederatedDataset", "PublicCorpus", "Vocabulary"]
