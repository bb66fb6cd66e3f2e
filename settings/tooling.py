"""Development tooling (the fencing experiment's command, the test suite): ops + `experiment`.

`experiment` is a development tool, never an app of a server role (ARCHITECTURE decision 13),
so no role overlay installs it; only this overlay, used by `make experiment` and pytest, does.
"""

from settings.ops import *  # noqa: F403
from settings.ops import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "experiment"]
