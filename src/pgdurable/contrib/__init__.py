"""Integrations with web frameworks, each behind its own optional extra: ``pgdurable.contrib.fastapi``
(``pgdurable[fastapi]``) and ``pgdurable.contrib.django`` (``pgdurable[django]``)."""
