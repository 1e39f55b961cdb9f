"""Errors that the command-line entry points turn into one ``error: ...`` line."""


class ConfigError(ValueError):
    """Invalid user input (config value, missing data file, unaccountable combination).

    Entry points catch it, print ``error: <message>`` on one line to stderr and exit 2 before
    anything is written.
    """


class DamagedFileError(ConfigError):
    """A file of a run directory (checkpoint, config, metrics) is corrupt, truncated, or not what
    fedpriv wrote; the message names the file. Exit 2, nothing touched."""


class RunDirectoryBusy(ConfigError):
    """Another process holds the run directory's lock. Exit 2, nothing touched."""


class OutputError(RuntimeError):
    """Writing an output failed (a full disk, a read-only directory); the message is one line and
    the files written before are intact. Entry points print it and exit 1."""


class PrivacyBudgetExceeded(RuntimeError):
    """Raised when training would spend more than the configured privacy budget."""
