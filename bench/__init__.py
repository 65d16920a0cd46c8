"""End-to-end benchmark of rebaser against a minimal hand-written baseline (see ``bench/bench.py``)."""
