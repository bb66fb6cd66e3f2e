"""The local dev stack: a private PostgreSQL (and etcd) plus the four roles under gunicorn.

Used by `make up/down/status/clean` (`python -m devstack …`), by the demo, the experiment, the
benchmarks and the test suite, so the stack a newcomer starts is the stack the tests exercise.
Development tooling: no server role imports it, and it is not in the image.

Modules (import each name from its module): `common` (names, ports, waiting), `postgres`
(PgCluster), `etcd` (EtcdServer), `roles` (RoleProcess, manage, migrate_all), `envfile`
(.run/stack.env), `stack` (up, down, status, clean, restart_role), `proxy` (each role's nginx),
`demo` (`make demo`).
"""
