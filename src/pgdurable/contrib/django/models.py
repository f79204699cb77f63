"""No models: pgdurable's tables are its own (its migrations, run after Django's by ``manage.py migrate``).
This module exists so that Django sends this app the ``post_migrate`` signal."""
