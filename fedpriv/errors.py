"""Errors that the command-line entry points turn into one line and exit code 2."""


class ConfigError(ValueError):
    """Invalid user input (config value, missing data file, unaccountable combination).

    Entry points catch it, print ``error: <message>`` on one line to stderr and exit 2 before
    anything is written.
    """


class PrivacyBudgetExceeded(RuntimeError):
    """Raised when training would spend more than the configured privacy budget."""
