"""How a bench report marks its ceilings: oracle and order-oracle (spot.runtime.registry: a ceiling) read the
answer, so their rows are bounds, not decoders a user can run, in every table and plot."""
from __future__ import annotations

from spot.runtime.registry import decoder_names, is_decoder

CEILING_NOTE = (f"(ceiling): {' and '.join(decoder_names(ceiling=True))} read the answer, the standard decoding's trajectory, which they "
                "decode first and leave out of their passes and times: bounds on what a drafter could reach, not "
                "decoders to deploy.")


def row_label(row: dict) -> str:
    """A row's name in tables and plots: its variant, marked when it is a ceiling (CEILING_NOTE)."""
    return row["variant"] + (" (ceiling)" if is_decoder(row.get("decoder"), ceiling=True) else "")
