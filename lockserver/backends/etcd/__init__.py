"""The etcd lock backend (lock.backend=etcd): `backend.EtcdLockBackend`, built from the parts
this package's modules define (the key layout: `keys`)."""
