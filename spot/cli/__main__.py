"""`python -m spot.cli ...` == `spot ...`."""
from spot.entry import spot

spot()
