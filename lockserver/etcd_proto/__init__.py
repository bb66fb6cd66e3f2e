"""etcd's gRPC stubs, made by `make etcd-stubs` (scripts/etcd_stubs.py): never edit."""
