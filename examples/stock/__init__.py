"""A stock counter fenced on `stock:{sku}`: the fence kit in a service of its own.

`service.py` is the whole adopter (a Django view, its settings, a psycopg table);
`story.py` is what `make example` plays against the running stack (docs/fence-kit.md).
"""
