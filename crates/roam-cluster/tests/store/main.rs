//! The cluster store's tests: one contract over both backends, then what
//! is particular to each (a reopened redb file; etcd dying under a client).

#[macro_use]
mod contract;
mod embedded;
mod etcd;
mod etcd_secure;
