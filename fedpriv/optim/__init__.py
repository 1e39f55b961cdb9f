"""Server optimizers (post-processing of the privatized update)."""

from fedpriv.optim.server import ServerAdam, ServerSGD, build_server_optimizer

__all__ = ["ServerAdam", "ServerSGD", "build_server_optimizer"]
