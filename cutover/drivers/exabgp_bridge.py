"""ExaBGP API process: forward command lines from a FIFO to ExaBGP, its acks to another FIFO.

ExaBGP's API is the stdin/stdout of a process it starts itself. Configure

    process lifeline-cutover {
        run /path/to/python -m cutover.drivers.exabgp_bridge /run/lifeline/zone-a.cmd /run/lifeline/zone-a.ack;
        encoder text;
    }

and run ExaBGP with `exabgp_api_ack=true`: every line the driver writes to
the command FIFO (`announce route …`, `withdraw route …`) reaches ExaBGP,
and ExaBGP's `done` / `error` answer comes back on the ack FIFO, in order.
Both FIFOs are opened read-write here, so neither side ever sees EOF while
the bridge lives; when ExaBGP exits, stdin closes, the bridge exits, and a
driver's non-blocking open of the command FIFO fails with ENXIO — the
driver reports that as `DriverUnavailable`. Rejected: `exabgp cli`, which
needs ExaBGP's own FIFOs under /run and costs ~160 ms of Python start-up
per command.
"""

from __future__ import annotations

import os
import sys
import threading


def _commands_to_exabgp(command_fifo: str) -> None:
    fd = os.open(command_fifo, os.O_RDWR)
    with os.fdopen(fd, "rb", buffering=0) as commands:
        pending = b""
        while True:
            chunk = commands.read(65536)
            if not chunk:
                return
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                if line.strip():
                    sys.stdout.write(line.decode() + "\n")
                    sys.stdout.flush()


def main(argv: list[str]) -> int:
    command_fifo, ack_fifo = argv
    ack_fd = os.open(ack_fifo, os.O_RDWR)
    threading.Thread(target=_commands_to_exabgp, args=(command_fifo,), daemon=True).start()
    for line in sys.stdin:  # ExaBGP's answers; EOF when ExaBGP exits
        os.write(ack_fd, line.encode())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
