"""The `psoup` command line (click): thin commands over the library."""
