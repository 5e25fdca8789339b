"""The numpy host loop: noise, commit rules, decoders (standard, threshold, SPOT, SPOT-Sets). No torch here."""
