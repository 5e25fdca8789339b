"""User-facing errors: one clear line saying what is wrong, plus a hint on how to fix it."""


class SpotError(Exception):
    """An error caused by the user's input (path, checkpoint, argument). The CLI prints it without a traceback."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\n  hint: {self.hint}"


def run_script(main) -> None:
    """Entry point of the scripts under benchmarks/ and scripts/: exit with main()'s status; a SpotError becomes one
    `error:` line (and its hint) with exit status 2, as in the CLI."""
    import sys
    try:
        sys.exit(main())
    except SpotError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
