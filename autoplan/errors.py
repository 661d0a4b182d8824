"""The exceptions autoplan raises on bad input; the CLI prints them as one line and exits 2."""

__all__ = [
    "AutoplanError",
    "InfeasibleError",
    "InputError",
    "LaunchMismatchError",
]


class AutoplanError(Exception):
    """Base of every error that is the user's input, not a bug: shown as one line, exit code 2."""


class InputError(AutoplanError):
    """A model name, file, option or size that cannot be used as given."""


class InfeasibleError(AutoplanError):
    """No plan satisfies the constraints; the message names the one that binds."""


class LaunchMismatchError(AutoplanError):
    """The processes launched do not match the plan (world size, nodes, local ranks)."""
