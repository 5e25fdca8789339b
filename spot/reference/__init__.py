"""The torch reference: SDAR model (SPEC §1) and the torch twin of the noise. Needs the `export` extra (torch)."""
