"""Several seeds of one experiment: the runs, their seeds.json, and results compared side by side."""
