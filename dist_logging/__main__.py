"""``python -m dist_logging``: the same as the ``dist-logging`` command."""

import sys

from dist_logging.cli import main

if __name__ == '__main__':
    sys.exit(main())
