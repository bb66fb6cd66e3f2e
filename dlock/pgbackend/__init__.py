"""django-prometheus' PostgreSQL engine, with its counting cursor class made once (see base)."""
