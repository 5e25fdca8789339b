"""`python -m spot ...` == `spot ...`."""
from spot.entry import spot

spot()
