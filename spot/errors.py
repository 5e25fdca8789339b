"""User-facing errors: one clear line saying what is wrong, plus a hint on how to fix it."""


class SpotError(Exception):
    """An error caused by the user's input (path, checkpoint, argument). The CLI prints it without a traceback."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\n  hint: {self.hint}"
