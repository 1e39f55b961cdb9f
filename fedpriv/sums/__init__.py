"""The sum protocol: how a round's clipped updates reach the server, and who adds the noise.

The ``aggregation`` option group (like ``mechanism`` or ``backend``) chooses one. Each option is a
:class:`fedpriv.schema.SumOption` registered from its module here (``register_option``): it
declares what the server ``sees`` and who may add the noise (``noise_by``: the server, or the
parties: a mechanism with ``client_noise``), refuses at parse time a run it cannot serve
(``check_run``), and plans the run's frozen :class:`SumPlan` (``plan``: protocol, who adds the
noise, parties, shares, threshold, the quantization or the field) through :func:`plan_sum`, the
one function the server's run plan and every node's call. Only the two dispatches — the server's
(``server.app.round_fn_for``) and the node's (``client.app.reply``) — read the plan's trust
model outside this package, the schema and the plan (tests/test_sums.py pins it).

* :mod:`.plain` — ``aggregation=plain``: the clear sum (party noise: a secure sum simulated in process);
* :mod:`.secagg` — ``aggregation=secagg``: Flower's SecAgg+ (server/secagg.py, client/secagg.py);
* :mod:`.wire` — what server and nodes share on the secure path (Flower's int32 limit, the weight,
  the field, the quantization, the instructions' keys);
* :mod:`.base` — :class:`SumPlan`, :func:`plan_sum`, the one user→party rule (:func:`assign_parties`).

A new protocol (Skellam parties, a TEE sum) costs its module here, its mechanism and event
(fedpriv/mechanisms/, fedpriv/accounting/), and one server/node pair (server/X.py, client/X.py)
that the two dispatches name.
"""

from __future__ import annotations

from fedpriv.sums import plain, secagg  # noqa: F401 — each registers its option
from fedpriv.sums.base import (PARTIES, SERVER, SumPlan, assign_parties, check_query, party_codec,  # noqa: F401
                               plan_sum, resolved_mechanism, who_adds_noise, withheld_rounds)
