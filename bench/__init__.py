"""``make bench``: every benchmark module's table, printed in turn."""
