"""The config: its schema, composing a command line into jobs, and the checks every job passes
before any run directory or process exists."""
