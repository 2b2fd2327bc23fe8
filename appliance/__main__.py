"""``python -m appliance``: the same as the ``appliance`` command."""

import sys

from appliance.cli import main

__all__: list[str] = []

if __name__ == "__main__":
    sys.exit(main())
