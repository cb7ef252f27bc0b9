"""Side-by-side benchmark of stampd against zeitgitterd 1.2.0 (``python -m bench.run``)."""
