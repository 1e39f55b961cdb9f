"""Privacy accounting: interpret mechanisms' DpEvents with dp_accounting, calibrate noise, keep the ledger.

The mechanism object is the one source of truth for *what* is released (its ``dp_event``); this
package only asks dp_accounting's RDP or PLD accountant what that costs.
"""

from fedpriv.accounting.accountant import (ACCOUNTANTS, PLD, PLD_VALUE_DISCRETIZATION, RDP,
                                           calibrate_noise_multiplier, compute_epsilon,
                                           describe_event, make_accountant, relation_name)
from fedpriv.accounting.ledger import PRIVACY_FILE, PrivacyLedger, json_epsilon

__all__ = [
    "ACCOUNTANTS", "PLD", "PLD_VALUE_DISCRETIZATION", "PRIVACY_FILE", "RDP", "PrivacyLedger",
    "calibrate_noise_multiplier", "compute_epsilon", "describe_event", "json_epsilon",
    "make_accountant", "relation_name",
]
