"""Server optimizers (post-processing of the privatized update) and the DP adaptive variants."""

from fedpriv.optim.adaptive import ADAPTIVE_NAMES, DPAdaptive, RoundRelease
from fedpriv.optim.server import ServerFTRL, ServerSGD, build_server_optimizer

__all__ = ["ADAPTIVE_NAMES", "DPAdaptive", "RoundRelease", "ServerFTRL", "ServerSGD", "build_server_optimizer"]
