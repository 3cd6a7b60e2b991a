"""Training one run: the loop (loop.py) and the collaborators it calls."""
