"""What every layer may use: the errors, atomic files, the run directory, the launcher a process
was started by, the log filters, and the fenced private APIs of the libraries."""
