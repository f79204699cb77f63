#!/usr/bin/env python
"""The Django shop example's manage.py (docs/integrations.md): ``python manage.py migrate``, ``runserver``,
``pgdurable_worker``, ``test``."""

import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shopsite.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
