"""``python -m import_probe <module> [args]``: ``python -m <module> [args]`` in this process, which
writes the top-level package of every import it makes (Python's audit hook) to the file
``$IMPORT_PROBE_FILE``, one per line, as it happens (the command may end without its teardown).
Its children are fresh interpreters (the forkserver and the workers forked from it): not recorded."""

import os
import runpy
import sys


def main() -> None:
    record = open(os.environ["IMPORT_PROBE_FILE"], "a", buffering=1)  # noqa: SIM115 -- for the process's life

    def hook(event: str, args: tuple) -> None:
        if event == "import":
            record.write(f"{args[0].partition('.')[0]}\n")

    sys.addaudithook(hook)
    module = sys.argv.pop(1)
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
