#!/usr/bin/env python
"""Django's command-line utility for administrative tasks."""

import os
import sys


def main():
    """Run administrative tasks."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    try:
        from django.core.management import execute_from_command_line
    except ImportError as exc:
        raise ImportError(
            "Couldn't import Django. Are you sure it's installed and "
            "available on your PYTHONPATH environment variable? Did you "
            "forget to activate a virtual environment?"
        ) from exc
    from django.core.exceptions import ImproperlyConfigured

    from config.process import leave

    try:
        execute_from_command_line(sys.argv)
    except ImproperlyConfigured as error:  # a bad setting: one line naming it, not a traceback
        print(f"Tether configuration: {error}", file=sys.stderr)
        leave(1)
    except SystemExit as exit:  # a command's own status (a usage error is 2)
        if exit.code is not None and not isinstance(exit.code, int):
            print(exit.code, file=sys.stderr)
        leave(exit.code if isinstance(exit.code, int) else (0 if exit.code is None else 1))
    # Done and said: Python's own finalisation of Django takes a second or more (config/process.py).
    leave(0)


if __name__ == "__main__":
    main()
