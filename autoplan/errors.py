"""The exceptions autoplan raises on bad input; the CLI prints them as one line and exits 2."""

__all__ = [
    "AutoplanError",
    "InfeasibleError",
    "InputError",
    "LaunchMismatchError",
    "PlanInvalidError",
]


class AutoplanError(Exception):
    """Base of every error that is the user's input, not a bug: shown as one line, exit code 2."""


class InputError(AutoplanError):
    """A model name, file, option or size that cannot be used as given."""


class InfeasibleError(AutoplanError):
    """No plan satisfies the constraints; the message names the one that binds, with numbers,
    and ``short`` says it in a few words (a row of ``autoplan sweep``'s table)."""

    def __init__(self, message: str, short: str = "") -> None:
        super().__init__(message)
        self.short = short or message


class LaunchMismatchError(AutoplanError):
    """The processes launched do not match the plan (world size, nodes, local ranks)."""


class PlanInvalidError(AutoplanError):
    """A plan breaks rules that every executable plan obeys; ``problems`` lists each one.

    With ``source`` (the file it was read from) the message is that file's first problem and
    how many more there are, the line a command prints; without, every problem numbered."""

    def __init__(self, problems: list[str], source: str | None = None) -> None:
        self.problems = list(problems)
        if source is None:
            numbered = "; ".join(f"({i}) {p}" for i, p in enumerate(self.problems, start=1))
            super().__init__(f"plan is invalid, {len(self.problems)} problem(s): {numbered}")
            return
        more = len(self.problems) - 1
        tail = f" (and {more} more: autoplan validate lists them)" if more else ""
        super().__init__(f"{source}: invalid plan: {self.problems[0]}{tail}")
