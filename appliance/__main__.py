"""``python -m appliance``: the same as the ``appliance`` command."""

import sys

from appliance.cli import main

sys.exit(main())
