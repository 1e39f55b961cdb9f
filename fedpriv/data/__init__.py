"""Federated datasets: the synthetic default, StackOverflow (TFF sqlite), and their common form."""

from fedpriv.data.federated import FederatedDataset, PublicCorpus, Vocabulary

__all__ = ["FederatedDataset", "PublicCorpus", "Vocabulary"]
