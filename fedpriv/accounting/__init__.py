"""Privacy accounting: interpret mechanisms' DpEvents with dp_accounting, calibrate noise, keep the ledger.

The mechanism object is the one source of truth for *what* is released (its ``dp_event``); this
package only asks dp_accounting's RDP or PLD accountant what that costs.

The names below are imported on first use (PEP 562), so that ``python -m fedpriv.accounting`` and
``fedpriv.accounting.monte_carlo`` do not pay for the ledger's imports (the run directory, torch).
"""

from __future__ import annotations

from typing import Any

_ACCOUNTANT = ("ACCOUNTANTS", "PLD", "PLD_VALUE_DISCRETIZATION", "RDP", "calibrate_noise_multiplier",
               "compute_epsilon", "describe_event", "make_accountant", "relation_name")
_LEDGER = ("PRIVACY_FILE", "PrivacyLedger", "json_epsilon")

__all__ = sorted(_ACCOUNTANT + _LEDGER)


def __getattr__(name: str) -> Any:
    if name in _ACCOUNTANT:
        from fedpriv.accounting import accountant  # lazy: PEP 562, on first use (module docstring)

        return getattr(accountant, name)
    if name in _LEDGER:
        from fedpriv.accounting import ledger  # lazy: PEP 562, keeps the calculator off the ledger's imports

        return getattr(ledger, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
