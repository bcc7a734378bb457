//! (etcd tests come with the etcd backend)
