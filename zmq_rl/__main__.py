"""``python -m zmq_rl``: the ``zmq-rl`` command (run, eval, plot)."""

import sys

from zmq_rl.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
