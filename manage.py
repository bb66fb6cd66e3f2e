#!/usr/bin/env python
"""Django's command-line utility; ROLE selects the settings overlay."""

import sys

from dlock.roles import configure_settings_module


def main() -> None:
    configure_settings_module()
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
